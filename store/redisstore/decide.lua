-- decide.lua: drip decisions as one atomic step. It follows drip.Eval
-- (math.go) exactly, in the integers of bigint.lua, which is prepended to
-- this file.
--
-- ARGV[1] is the mode: "take", "peek" or "refund" decide the requests
-- together (one request, or an all-or-nothing multi-take over them all);
-- "batch" decides each request on its own, in order, with its own op
-- (requests coalesced from concurrent callers).
--
-- KEYS[i] is request i's bucket: a string "tokens s n" (micro-tokens, and
-- ts as whole seconds and nanoseconds, ts = s*1e9 + n, 0 <= n < 1e9).
-- ARGV[2] is the number of distinct limits L, then 8 values per limit, all
-- decimal integers: kind (0 continuous, 1 interval, 2 fixed window),
-- rate, period, crate, cperiod (rate and period divided by their gcd),
-- burst, max_reserved (-1: no bound), start. Then 6 values per request:
-- its limit (1..L), op ("take", "peek", "refund"; used in batch mode),
-- cost, reserve ("1" or "0"), now_s, now_n (the decision's time; both ""
-- for the server's TIME).
--
-- Reply: {now_s, now_n (the server's TIME if read, else 0 0), then per
-- request 5 values: found, tokens, ts_s, ts_n (the stored bucket before),
-- flags (1: allowed, 2: written)}. The caller recomputes each decision
-- from the state before with drip.Eval and checks allowed and written
-- against it.
--
-- A denial or a peek writes nothing. A write sets a TTL a little past the
-- bucket's expiry (drip.Params.ExpiresAt), so idle buckets vanish; a
-- missing key is a fresh bucket.

local NS = 1000000000

-- Times are pairs (s, n): s is a plain number (|s| < 2^34 for any int64
-- of nanoseconds), n in [0, 1e9).

-- tdiff is (as, an) - (bs, bn) in nanoseconds, an integer.
local function tdiff(as, an, bs, bn)
  local ds = as - bs
  if ds < 9000000 and ds > -9000000 then return ds * NS + (an - bn) end
  return add(mul(ds, NS), an - bn)
end

-- tadd is (s, n) + d nanoseconds.
local function tadd(s, n, d)
  local q, r = divmod(add(n, d), NS)
  return s + q, r
end

local function tcmp(as, an, bs, bn)
  if as ~= bs then
    if as < bs then return -1 end
    return 1
  end
  if an < bn then return -1 end
  if an > bn then return 1 end
  return 0
end

local srvs, srvn = 0, 0
local haveTime = false
local function servertime()
  if not haveTime then
    local t = redis.call('TIME')
    srvs, srvn = tonumber(t[1]), tonumber(t[2]) * 1000
    haveTime = true
  end
  return srvs, srvn
end

-- fresh is the bucket of a key never seen (or expired) at now.
local function fresh(q)
  local l = q.l
  if l.kind == 2 then
    -- m = (now - start) mod period
    local _, m, a, b
    if type(l.period) == 'number' and l.period < 67108864 then
      _, a = divmod(q.nows, l.period)
      _, b = divmod(NS, l.period)
      _, m = divmod(a * b + q.nown - l.start, l.period)
    else
      _, m = divmod(sub(add(mul(q.nows, NS), q.nown), l.start), l.period)
    end
    local s, n = tadd(q.nows, q.nown, neg(m))
    return l.burst, s, n
  end
  return l.burst, q.nows, q.nown
end

-- expired is drip.Params.ExpiresAt(b) <= now for a fixed window or an
-- interval refill: the bucket carries no information any more and starts
-- afresh. (For a continuous refill, expiry and refilled give the same
-- bucket, so it is not computed.) A bucket that is not full expires
-- k = ceil(need / rate) periods after ts, an interval bucket one period
-- later still (it keeps its grid for a period of being full); Go's
-- saturation makes a bucket with ts < 0 that is not full never expire.
local function expired(q, tokens, s, n)
  local l = q.l
  local need = sub(l.burst, tokens)
  local short = cmp(need, 0) > 0
  local c = tcmp(q.nows, q.nown, s, n)
  if l.kind == 2 and not short then return c >= 0 end
  if c <= 0 then return false end
  if short and s < 0 then return false end
  local k = 0
  if short then
    local r
    k, r = divmod(need, l.rate)
    if r ~= 0 then k = add(k, 1) end
  end
  if l.kind == 1 then k = add(k, 1) end
  return cmp((divmod(tdiff(q.nows, q.nown, s, n), l.period)), k) >= 0
end

-- refilled is the bucket (tokens, s, n) brought forward to now.
local function refilled(q, tokens, s, n)
  local l = q.l
  if tcmp(q.nows, q.nown, s, n) <= 0 then
    if cmp(tokens, l.burst) > 0 then return l.burst, s, n end
    return tokens, s, n
  end
  local e = tdiff(q.nows, q.nown, s, n)
  local missing = sub(l.burst, tokens)
  if l.kind == 0 then
    if cmp(missing, 0) <= 0 then return l.burst, q.nows, q.nown end
    -- floor(e*rate/period) and floor(((e*rate) mod period) / rate), in
    -- the reduced rate and period: the same numbers, smaller operands.
    local add_, rem = divmod(mul(e, l.crate), l.cperiod)
    if cmp(add_, missing) >= 0 then return l.burst, q.nows, q.nown end
    local back = divmod(rem, l.crate)
    local ns, nn = tadd(q.nows, q.nown, neg(back))
    return add(tokens, add_), ns, nn
  end
  local k = divmod(e, l.period)
  s, n = tadd(s, n, mul(k, l.period))
  if cmp(missing, 0) <= 0 then return l.burst, s, n end
  local need, r = divmod(missing, l.rate)
  if r ~= 0 then need = add(need, 1) end
  if cmp(k, need) >= 0 then return l.burst, s, n end
  return add(tokens, mul(k, l.rate)), s, n
end

-- refilledFast is refilled for a continuous refill when every number
-- involved is a plain double below 2^52 and ts is within 104 days of now
-- (the common case), with the operations inlined; it returns nil when it
-- does not apply, and refilled decides.
local function refilledFast(l, nows, nown, tokens, s, n)
  local ds = nows - s
  if ds < 0 or ds >= 9000000 or (ds == 0 and nown <= n) then return nil end
  local missing = l.burst - tokens
  if missing <= 0 then return l.burst, nows, nown end
  local p = (ds * NS + (nown - n)) * l.crate
  if p >= HALF then return nil end
  local cp, cr = l.cperiod, l.crate
  local k = floor(p / cp)
  local rem = p - k * cp
  if rem < 0 then
    k, rem = k - 1, rem + cp
  elseif rem >= cp then
    k, rem = k + 1, rem - cp
  end
  if k >= missing then return l.burst, nows, nown end
  local back = floor(rem / cr)
  local r = rem - back * cr
  if r < 0 then
    back = back - 1
  elseif r >= cr then
    back = back + 1
  end
  -- ts = now - back, back < 2^52
  local nn = nown - back
  local c = floor(nn / NS)
  nn = nn - c * NS
  if nn < 0 then
    c, nn = c - 1, nn + NS
  elseif nn >= NS then
    c, nn = c + 1, nn - NS
  end
  return tokens + k, nows + c, nn
end

-- ttl is how long, in milliseconds of real time, to keep a bucket: an
-- estimate in doubles of ExpiresAt - now, rounded up generously, plus a
-- minute (as memstore's sweeper keeps a bucket a minute past expiry, for
-- clocks that step back a little). Decisions do not rest on it (expired
-- does that exactly), only memory does.
local function ttl(q, tokens, s, n)
  local l = q.l
  if l.fast and l.kind == 0 and type(tokens) == 'number' then
    local x = (s - q.nows) * NS + (n - q.nown)
    local need = l.burst - tokens
    if need > 0 then x = x + need * l.period / l.rate end
    if x < 0 then x = 0 end
    local ms = math.ceil(x / 1e6 * (1 + 1e-9)) + 60000
    if ms > 1e15 then ms = 1e15 end
    return string.format('%.0f', ms)
  end
  local need = todouble(sub(l.burst, tokens))
  local d = 0
  if need > 0 then
    if l.kind == 0 then
      d = need * todouble(l.period) / todouble(l.rate)
    else
      d = (need / todouble(l.rate) + 1) * todouble(l.period)
    end
  end
  if l.kind == 1 then d = d + todouble(l.period) end
  local x = todouble(tdiff(s, n, q.nows, q.nown)) + d
  if x < 0 then x = 0 end
  local ms = math.ceil(x / 1e6 * (1 + 1e-9)) + 60000
  if ms > 1e15 then ms = 1e15 end
  return string.format('%.0f', ms)
end

-- decide reads request q's bucket and decides it, without writing.
local function decide(q, key)
  local l = q.l
  if q.nowarg == '' then
    q.nows, q.nown = servertime()
  else
    q.nows, q.nown = tonumber(q.nowarg), tonumber(q.nownarg)
  end
  local v = redis.call('GET', key)
  local tok, s, n
  if v then
    local x, y, z = string.match(v, '^(%-?%d+) (%-?%d+) (%d+)$')
    if x then
      q.found, q.otok, q.os, q.on = 1, x, tonumber(y), tonumber(z)
      tok, s, n = parse(x), q.os, q.on
      if l.kind ~= 0 then
        if expired(q, tok, s, n) then
          tok = nil
        else
          tok, s, n = refilled(q, tok, s, n)
        end
      else
        local t2, s2, n2
        if l.fast and type(tok) == 'number' and tok < HALF and tok > -HALF then
          t2, s2, n2 = refilledFast(l, q.nows, q.nown, tok, s, n)
        end
        if t2 then
          tok, s, n = t2, s2, n2
        else
          tok, s, n = refilled(q, tok, s, n)
        end
      end
    end
  end
  if tok == nil then
    -- Fresh; refilling a fresh bucket at now changes nothing.
    tok, s, n = fresh(q)
  end
  local allowed, nt = false, tok
  if q.op == 'refund' then
    allowed = true
    nt = add(tok, q.cost)
    if cmp(nt, l.burst) > 0 then nt = l.burst end
  elseif (type(tok) == 'number' and type(q.cost) == 'number' and tok >= q.cost) or cmp(tok, q.cost) >= 0 then
    allowed = true
    nt = sub(tok, q.cost)
  elseif q.reserve and (cmp(l.maxr, 0) < 0 or cmp(sub(q.cost, tok), l.maxr) <= 0) then
    allowed = true
    nt = sub(tok, q.cost)
  end
  if allowed then q.flags = 1 end
  q.allowed, q.nt, q.ns, q.nn = allowed, nt, s, n
end

local function write(q, key)
  q.flags = q.flags + 2
  local nt = q.nt
  if type(nt) == 'number' then
    if nt == 0 then nt = 0 end -- not -0
    redis.call('SET', key, string.format('%.0f %d %d', nt, q.ns, q.nn), 'PX', ttl(q, q.nt, q.ns, q.nn))
  else
    redis.call('SET', key, str(nt) .. string.format(' %d %d', q.ns, q.nn), 'PX', ttl(q, q.nt, q.ns, q.nn))
  end
end

local mode = ARGV[1]
local nl = tonumber(ARGV[2])
local limits = {}
for i = 1, nl do
  local a = 2 + (i - 1) * 8
  limits[i] = {
    kind = tonumber(ARGV[a + 1]),
    rate = parse(ARGV[a + 2]),
    period = parse(ARGV[a + 3]),
    crate = parse(ARGV[a + 4]),
    cperiod = parse(ARGV[a + 5]),
    burst = parse(ARGV[a + 6]),
    maxr = parse(ARGV[a + 7]),
    start = parse(ARGV[a + 8]),
  }
  local t = limits[i]
  t.fast = type(t.rate) == 'number' and type(t.period) == 'number' and type(t.burst) == 'number'
    and t.burst < HALF and t.period < HALF and t.crate < HALF and t.cperiod < HALF
end
local reqs = {}
for i = 1, #KEYS do
  local a = 2 + nl * 8 + (i - 1) * 6
  local op = mode
  if mode == 'batch' then op = ARGV[a + 2] end
  -- All fields at once: a constructor sizes the table once.
  reqs[i] = {
    l = limits[tonumber(ARGV[a + 1])], op = op,
    cost = parse(ARGV[a + 3]), reserve = ARGV[a + 4] == '1',
    nowarg = ARGV[a + 5], nownarg = ARGV[a + 6],
    nows = 0, nown = 0, found = 0, otok = '0', os = 0, on = 0,
    allowed = false, flags = 0, nt = 0, ns = 0, nn = 0,
  }
end

if mode == 'batch' then
  for i = 1, #KEYS do
    local q = reqs[i]
    decide(q, KEYS[i])
    if q.op == 'refund' or (q.op == 'take' and q.allowed) then write(q, KEYS[i]) end
  end
else
  local all = true
  for i = 1, #KEYS do
    decide(reqs[i], KEYS[i])
    if not reqs[i].allowed then all = false end
  end
  if mode == 'refund' or (mode == 'take' and all) then
    for i = 1, #KEYS do write(reqs[i], KEYS[i]) end
  end
end

local out = {srvs, srvn}
for i = 1, #KEYS do
  local q = reqs[i]
  local j = #out
  out[j + 1] = q.found
  out[j + 2] = q.otok
  out[j + 3] = q.os
  out[j + 4] = q.on
  out[j + 5] = q.flags
end
return out
