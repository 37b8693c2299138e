-- Sets (ARGV[1] "put") or deletes (ARGV[1] "del") one override (package
-- override). KEYS[1] is the hash of overrides (field: bucket key, value:
-- the override as JSON), KEYS[2] their version, which every change bumps;
-- KEYS[3] the record of changes (a sorted set: member the key, score the
-- version of its latest change), KEYS[4] a hash of two numbers about it:
-- floor (the record holds every change after this version) and logged
-- (the version of the latest change recorded: a version beyond it was
-- changed by a drip that records none, so what came before is unknown).
-- A change is published on ARGV[5]. Every key shares a hash tag, so the
-- script runs on Redis Cluster.
-- put: ARGV[2] key, ARGV[3] value, ARGV[4] the most overrides held.
-- ARGV[6] is how many changes the record keeps (override.KeepChanges).
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
local before = tonumber(redis.call('GET', KEYS[2]) or '0')
local logged = redis.call('HGET', KEYS[4], 'logged')
local floor = tonumber(redis.call('HGET', KEYS[4], 'floor') or '0')
if tonumber(logged or '-1') ~= before then
  floor = before -- unrecorded changes up to here (or none recorded yet)
end
local v = redis.call('INCR', KEYS[2])
redis.call('ZADD', KEYS[3], v, field)
local keep = tonumber(ARGV[6])
if v - keep > floor then
  floor = v - keep
  redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', floor)
end
redis.call('HSET', KEYS[4], 'floor', floor, 'logged', v)
redis.call('PUBLISH', ARGV[5], '')
return 1
