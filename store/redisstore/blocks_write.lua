-- blocks_write.lua: compare and set. ARGV[i] (i <= #KEYS) is the value
-- KEYS[i] must still hold ("" for none); then, per key, its new value and
-- its TTL in milliseconds (an empty value: leave the key as it is). If
-- any key changed since it was read, nothing is written and the reply is
-- 0; else every new value is set and the reply is 1.
local n = #KEYS
for i = 1, n do
  if (redis.call('GET', KEYS[i]) or '') ~= ARGV[i] then return 0 end
end
for i = 1, n do
  local v = ARGV[n + 2 * i - 1]
  if v ~= '' then
    redis.call('SET', KEYS[i], v, 'PX', ARGV[n + 2 * i])
  end
end
return 1
