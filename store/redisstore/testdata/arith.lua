-- arith.lua: exposes bigint.lua's operations to redisstore's tests, which
-- compare them with math/big on extreme values. bigint.lua is prepended.
-- ARGV[1] is the operation, ARGV[2] and ARGV[3] its operands (decimal).
local a, b = parse(ARGV[2]), parse(ARGV[3])
local op = ARGV[1]
if op == 'add' then return {str(add(a, b))} end
if op == 'sub' then return {str(sub(a, b))} end
if op == 'mul' then return {str(mul(a, b))} end
if op == 'cmp' then return {tostring(cmp(a, b))} end
if op == 'divmod' then
  local q, r = divmod(a, b)
  return {str(q), str(r)}
end
if op == 'muldivmod' then
  -- floor(a*b/c), (a*b) mod c: the continuous refill's shape
  local q, r = divmod(mul(a, b), parse(ARGV[4]))
  return {str(q), str(r)}
end
return redis.error_reply('unknown op ' .. op)
