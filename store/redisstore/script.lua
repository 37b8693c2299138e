-- script.lua: the decision code as a script (EVALSHA, then EVAL), for
-- servers without functions (see call.go). The Go side puts bigint.lua and
-- decide.lua in place of the CODE marker; every call runs their
-- definitions.
local function init()
{{CODE}}
return main
end

return init()(KEYS, ARGV)
