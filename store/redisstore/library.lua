-- library.lua: the decision code as a Redis Function library (see
-- call.go). The Go side puts the shebang line with the library's name
-- before it, the name in place of the NAME marker, and bigint.lua and
-- decide.lua in place of the CODE marker.
--
-- Library code runs at FUNCTION LOAD with only the redis API in reach (no
-- string, math or struct), so the definitions run on the first call
-- instead, and the library keeps them for every later call: a script
-- would run them all again each time.
local main

local function init()
{{CODE}}
return main
end

redis.register_function('{{NAME}}', function(keys, args)
  if not main then main = init() end
  return main(keys, args)
end)
