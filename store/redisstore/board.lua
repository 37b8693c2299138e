-- The notice board (store.Board): KEYS[1] a hash of each instance's blob,
-- KEYS[2] a hash of when each was put and expires ("put:expires", ms of
-- the server's clock); one hash tag, so one Cluster slot. Expired
-- instances are dropped from both on every call.
-- ARGV: "put", instance, blob, ttl (ms), most instances; or "read".
-- put answers 1, or -1 when the instance is new and the board full;
-- read answers instance, age (ms), blob, ... for each live instance.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local times = redis.call('HGETALL', KEYS[2])
local live, puts, last = {}, {}, now
for i = 1, #times, 2 do
  local put, exp = string.match(times[i + 1], '^(%d+):(%d+)$')
  exp = tonumber(exp)
  if exp <= now then
    redis.call('HDEL', KEYS[1], times[i])
    redis.call('HDEL', KEYS[2], times[i])
  else
    live[#live + 1] = times[i]
    puts[times[i]] = tonumber(put)
    if exp > last then last = exp end
  end
end
if ARGV[1] == 'read' then
  local out = {}
  if #live == 0 then return out end
  local blobs = redis.call('HMGET', KEYS[1], unpack(live))
  for i, inst in ipairs(live) do
    if blobs[i] then
      out[#out + 1] = inst
      out[#out + 1] = now - puts[inst]
      out[#out + 1] = blobs[i]
    end
  end
  return out
end
local inst, exp = ARGV[2], now + tonumber(ARGV[4])
if not puts[inst] and #live >= tonumber(ARGV[5]) then return -1 end
redis.call('HSET', KEYS[1], inst, ARGV[3])
redis.call('HSET', KEYS[2], inst, now .. ':' .. exp)
if exp > last then last = exp end
redis.call('PEXPIREAT', KEYS[1], last)
redis.call('PEXPIREAT', KEYS[2], last)
return 1
