-- The overrides changed after version ARGV[1] (package override's
-- OverridesSince), read at once. KEYS as in override.lua: the hash of
-- overrides, their version, the record of changes and its floor/logged.
-- Returns {version, 0} when the record cannot tell what changed since
-- then, else {version, 1, keys, values} (a deleted key's value is false).
local since = tonumber(ARGV[1])
local v = tonumber(redis.call('GET', KEYS[2]) or '0')
local logged = tonumber(redis.call('HGET', KEYS[4], 'logged') or '-1')
local floor = tonumber(redis.call('HGET', KEYS[4], 'floor') or '0')
if v == since then
  return {v, 1, {}, {}}
end
if logged ~= v or since < floor or since > v then
  return {v, 0}
end
local keys = redis.call('ZRANGEBYSCORE', KEYS[3], '(' .. since, '+inf')
local vals = {}
if #keys > 0 then
  vals = redis.call('HMGET', KEYS[1], unpack(keys))
end
return {v, 1, keys, vals}
