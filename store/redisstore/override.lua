-- Sets (ARGV[1] "put") or deletes (ARGV[1] "del") one override (package
-- override). KEYS[1] is the hash of overrides (field: bucket key, value:
-- the override as JSON), KEYS[2] their version, which every change bumps;
-- a change is published on ARGV[5]. Both keys share a hash tag, so the
-- script runs on Redis Cluster.
-- put: ARGV[2] key, ARGV[3] value, ARGV[4] the most overrides held.
-- Returns 1 for a change, 0 for none (a delete of nothing), -1 when full.
local op, field = ARGV[1], ARGV[2]
if op == 'put' then
  if redis.call('HEXISTS', KEYS[1], field) == 0 and redis.call('HLEN', KEYS[1]) >= tonumber(ARGV[4]) then
    return -1
  end
  redis.call('HSET', KEYS[1], field, ARGV[3])
elseif redis.call('HDEL', KEYS[1], field) == 0 then
  return 0
end
redis.call('INCR', KEYS[2])
redis.call('PUBLISH', ARGV[5], '')
return 1
