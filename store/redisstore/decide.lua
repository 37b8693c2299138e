-- decide.lua: one drip decision, or an all-or-nothing multi-take, as one
-- atomic step. It follows drip.Eval (math.go) exactly, in the integers of
-- bigint.lua, which is prepended to this file.
--
-- KEYS[i]   the bucket of request i: a string "tokens ts" (micro-tokens,
--           nanoseconds).
-- ARGV[1]   op: "take", "peek" or "refund".
-- ARGV[2]   now in nanoseconds, or "" for the server's clock (TIME).
-- ARGV[3..] per request, 8 values: kind (0 continuous, 1 interval,
--           2 fixed window), rate, period, burst, max_reserved (-1: no
--           bound), start, cost, reserve ("1" or "0"). All integers are
--           decimal strings.
--
-- Reply: {now, written, then per request: found, tokens, ts, allowed,
-- next_tokens, next_ts}, all strings. tokens and ts are the stored state
-- before the decision (empty when not found): the caller recomputes the
-- decision's fields from them with drip.Eval, and checks that allowed and
-- next agree with it.
--
-- A denial or a peek writes nothing. A write sets a TTL a little past
-- the bucket's expiry (drip.Params.ExpiresAt), so idle buckets vanish; a
-- missing key is a fresh bucket.

local op = ARGV[1]
local now
if ARGV[2] == '' then
  local t = redis.call('TIME')
  now = add(mul(tonumber(t[1]), 1000000000), tonumber(t[2]) * 1000)
else
  now = parse(ARGV[2])
end

-- fresh is the bucket of a key never seen (or expired) at now.
local function fresh(kind, period, burst, start)
  if kind == 2 then
    local _, m = divmod(sub(now, start), period)
    return burst, sub(now, m)
  end
  return burst, now
end

-- refilled is the bucket (tokens, ts) brought forward to now.
local function refilled(kind, rate, period, burst, tokens, ts)
  if cmp(now, ts) <= 0 then
    if cmp(tokens, burst) > 0 then return burst, ts end
    return tokens, ts
  end
  local e = sub(now, ts)
  local missing = sub(burst, tokens)
  if kind == 0 then
    if cmp(missing, 0) <= 0 then return burst, now end
    local q, rem = divmod(mul(e, rate), period)
    if cmp(q, missing) >= 0 then return burst, now end
    local back = divmod(rem, rate)
    return add(tokens, q), sub(now, back)
  end
  local n = divmod(e, period)
  ts = add(ts, mul(n, period))
  if cmp(missing, 0) <= 0 then return burst, ts end
  local k, r = divmod(missing, rate)
  if r ~= 0 then k = add(k, 1) end
  if cmp(n, k) >= 0 then return burst, ts end
  return add(tokens, mul(n, rate)), ts
end

-- expired is drip.Params.ExpiresAt(b) <= now for a fixed window or an
-- interval refill: the bucket carries no information any more and starts
-- afresh. (For a continuous refill, expiry and refilled give the same
-- bucket, so it is not computed.) A bucket that is not full expires
-- k = ceil(need / rate) periods after ts, an interval bucket one period
-- later still (it keeps its grid for a period of being full); Go's
-- saturation makes a bucket with ts < 0 that is not full never expire.
local function expired(kind, rate, period, burst, tokens, ts)
  local need = sub(burst, tokens)
  local short = cmp(need, 0) > 0
  if kind == 2 and not short then return cmp(now, ts) >= 0 end
  if cmp(now, ts) <= 0 then return false end
  if short and cmp(ts, 0) < 0 then return false end
  local k = 0
  if short then
    local r
    k, r = divmod(need, rate)
    if r ~= 0 then k = add(k, 1) end
  end
  if kind == 1 then k = add(k, 1) end
  return cmp((divmod(sub(now, ts), period)), k) >= 0
end

-- ttl is how long, in milliseconds of real time, to keep a bucket: an
-- estimate in doubles of ExpiresAt - now, rounded up generously, plus a
-- minute (as memstore's sweeper keeps a bucket a minute past expiry, for
-- clocks that step back a little). Decisions do not rest on it (expired
-- does that exactly), only memory does.
local function ttl(kind, rate, period, burst, tokens, ts)
  local need = todouble(sub(burst, tokens))
  local d = 0
  if need > 0 then
    if kind == 0 then
      d = need * todouble(period) / todouble(rate)
    else
      d = (need / todouble(rate) + 1) * todouble(period)
    end
  end
  if kind == 1 then d = d + todouble(period) end
  local x = todouble(sub(ts, now)) + d
  if x < 0 then x = 0 end
  local ms = math.ceil(x / 1e6 * (1 + 1e-9)) + 60000
  if ms > 1e15 then ms = 1e15 end
  return string.format('%.0f', ms)
end

local n = #KEYS
local reqs = {}
local all = true
for i = 1, n do
  local a = 2 + (i - 1) * 8
  local q = {
    kind = tonumber(ARGV[a + 1]),
    rate = parse(ARGV[a + 2]),
    period = parse(ARGV[a + 3]),
    burst = parse(ARGV[a + 4]),
    maxr = parse(ARGV[a + 5]),
    start = parse(ARGV[a + 6]),
    cost = parse(ARGV[a + 7]),
    reserve = ARGV[a + 8] == '1',
    found = false, otok = '', ots = '',
  }
  local v = redis.call('GET', KEYS[i])
  local tok, ts
  if v then
    local x, y = string.match(v, '^(%-?%d+) (%-?%d+)$')
    if x then
      q.found, q.otok, q.ots = true, x, y
      tok, ts = parse(x), parse(y)
      if q.kind ~= 0 and expired(q.kind, q.rate, q.period, q.burst, tok, ts) then
        tok = nil
      else
        tok, ts = refilled(q.kind, q.rate, q.period, q.burst, tok, ts)
      end
    end
  end
  if tok == nil then
    -- Fresh; refilling a fresh bucket at now changes nothing.
    tok, ts = fresh(q.kind, q.period, q.burst, q.start)
  end
  local allowed, nt = false, tok
  if op == 'refund' then
    allowed = true
    nt = add(tok, q.cost)
    if cmp(nt, q.burst) > 0 then nt = q.burst end
  elseif cmp(tok, q.cost) >= 0 then
    allowed = true
    nt = sub(tok, q.cost)
  elseif q.reserve and (cmp(q.maxr, 0) < 0 or cmp(sub(q.cost, tok), q.maxr) <= 0) then
    allowed = true
    nt = sub(tok, q.cost)
  end
  if not allowed then all = false end
  q.allowed, q.nt, q.nts = allowed, nt, ts
  reqs[i] = q
end

local write = op == 'refund' or (op == 'take' and all)
if write then
  for i = 1, n do
    local q = reqs[i]
    redis.call('SET', KEYS[i], str(q.nt) .. ' ' .. str(q.nts), 'PX',
      ttl(q.kind, q.rate, q.period, q.burst, q.nt, q.nts))
  end
end

local out = {str(now), write and '1' or '0'}
for i = 1, n do
  local q = reqs[i]
  local j = #out
  out[j + 1] = q.found and '1' or '0'
  out[j + 2] = q.otok
  out[j + 3] = q.ots
  out[j + 4] = q.allowed and '1' or '0'
  out[j + 5] = str(q.nt)
  out[j + 6] = str(q.nts)
end
return out
