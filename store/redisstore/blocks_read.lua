-- blocks_read.lua: the server's TIME and the values of KEYS (the blocks
-- state of leased limits, see blocks.go), "" for a missing key.
local t = redis.call('TIME')
local out = {t[1], t[2]}
for i = 1, #KEYS do
  out[#out + 1] = redis.call('GET', KEYS[i]) or ''
end
return out
