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

-- Several calls in one (the Go side's batch of multi-takes, each all or
-- nothing on its own): args[1] is the number of calls, then for each the
-- number of its keys and of its arguments, and its arguments; the keys
-- are each call's in turn. The answer is each call's answer, in order.
redis.register_function('{{NAME}}_groups', function(keys, args)
  if not main then main = init() end
  local out, ki, ai = {}, 1, 2
  for g = 1, tonumber(args[1]) do
    local nk, na = tonumber(args[ai]), tonumber(args[ai + 1])
    ai = ai + 2
    local k, a = {}, {}
    for j = 1, nk do k[j] = keys[ki]; ki = ki + 1 end
    for j = 1, na do a[j] = args[ai]; ai = ai + 1 end
    out[g] = main(k, a)
  end
  return out
end)
