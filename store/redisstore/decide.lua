-- decide.lua: drip decisions as one atomic step. It follows bucket.Eval
-- (bucket/bucket.go) exactly, in the integers of bigint.lua, which is prepended to
-- this file.
--
-- ARGV[1] is the mode: "take", "peek" or "refund" decide the requests
-- together (one request, or an all-or-nothing multi-take over them all);
-- "batch" decides each request on its own, in order, with its own op
-- (requests coalesced from concurrent callers), except requests joined
-- (op plus 16: joined to the next request), which it decides together,
-- all or nothing, as "take", "peek" or "refund" would (a multi-take in a
-- batch).
--
-- KEYS[i] is request i's bucket: a string, compact (20 bytes: the byte
-- 1, tokens as a 7-byte signed integer, s, n and the deadline in whole
-- seconds, rounded down, as unsigned 32-bit integers, all little-endian;
-- written when tokens is below 2^52 in magnitude and s in [0, 2^32), as
-- nearly always), binary (the form of earlier versions, read and written
-- when s is out of the compact form's range: a zero byte, then tokens, s,
-- n and deadline as little-endian doubles) or decimal, "tokens s n
-- deadline" (micro-tokens; ts as whole seconds and nanoseconds,
-- ts = s*1e9 + n, 0 <= n < 1e9; and when the key's TTL ends, in the
-- server's milliseconds, so that a write can keep a TTL that is long
-- enough; 0 or none: unknown); then, on a key with live blocks of leased
-- tokens, a newline and the blocks (see decideBlocks).
-- ARGV[2] is the number of distinct shapes S (a limit with a cost), then
-- one string per shape of 10 decimal integers separated by spaces: kind
-- (0 continuous, 1 interval, 2 fixed window, 5 calendar window), rate,
-- period, crate, cperiod
-- (rate and period divided by their gcd), burst, max_reserved (-1: no
-- bound), start, cost, reserve (1 or 0). Then one string of packed
-- requests, a record per key (struct format '<IBdd'): its shape (1..S);
-- its op (0 take, 1 peek, 2 refund; used in batch mode), plus 4 when the
-- request carries its own time, plus 8 when it is a block's (its ID and
-- life, "id ttl", follow the records in request order, with the lease
-- IDs of concurrency requests), plus 16 when joined to the next; that
-- time, whole seconds and nanoseconds
-- (both 0 for the server's TIME); and its deadline in the server's clock,
-- in microseconds (0: none). A request whose deadline is not after the
-- server's TIME is late: it is neither decided nor written (flag 32), and
-- a multi-take with a late request writes nothing. (The caller gave up on
-- it; it may have waited in a socket buffer while the server was paused.)
--
-- Reply: {now_s, now_n (the server's TIME), records, big...}: records
-- is one string of a packed record per request (struct format '<Bddd'):
-- flags (1: allowed, 2: written, 4: found, 8: the key holds another
-- type, 16: tokens is in big, 32: late, nothing decided, 128: a sliding
-- window, its state before in big, 192: decided under blocks of leased
-- tokens, the key's blocks before in big), tokens, ts_s, ts_n (the stored
-- bucket before); big holds, in order, those states and the tokens beyond
-- 2^53 in magnitude as decimals. The caller recomputes each decision from the state before
-- with bucket.Eval and checks allowed and written against it. (One string
-- instead of four values per request: the server converts, and the
-- client parses, a fraction of the reply.)
--
-- A denial or a peek writes nothing. A write leaves the key a TTL of at
-- least a minute past the bucket's expiry (bucket.Params.ExpiresAt), so idle
-- buckets vanish; a missing key is a fresh bucket.

local NS = 1000000000
-- CAL is the kind of a calendar window (bucket.Calendar): a fixed window
-- whose start (l.ss, l.sn) is an instant, with two rules more (decide).
local CAL = 5
local rcall, rpcall = redis.call, redis.pcall
local pack, unpack, byte, concat = struct.pack, struct.unpack, string.byte, table.concat
local gmatch, ssub, find, sort = string.gmatch, string.sub, string.find, table.sort
local TAKE, PEEK, REFUND = 0, 1, 2 -- drip.Op
-- REC is the size of a request's record; JOINED, added to its op, joins
-- it to the next request, all or nothing (a multi-take in a batch).
local REC, JOINED = 29, 16

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

-- fresh is the bucket of a key never seen (or expired) at now.
local function fresh(l, nows, nown)
  if l.kind == 2 or l.kind == CAL then
    -- m = (now - start) mod period
    local _, m, a, b
    if type(l.period) == 'number' and l.period < 67108864 then
      _, a = divmod(nows, l.period)
      _, b = divmod(NS, l.period)
      _, m = divmod(a * b + nown - l.start, l.period)
    else
      _, m = divmod(sub(add(mul(nows, NS), nown), l.start), l.period)
    end
    local s, n = tadd(nows, nown, neg(m))
    return l.burst, s, n
  end
  return l.burst, nows, nown
end

-- expired is bucket.Params.ExpiresAt(b) <= now for a fixed window or an
-- interval refill: the bucket carries no information any more and starts
-- afresh. (For a continuous refill, expiry and refilled give the same
-- bucket, so it is not computed.) A bucket that is not full expires
-- k = ceil(need / rate) periods after ts, an interval bucket one period
-- later still (it keeps its grid for a period of being full).
local function expired(l, nows, nown, tokens, s, n)
  local need = sub(l.burst, tokens)
  local short = cmp(need, 0) > 0
  local c = tcmp(nows, nown, s, n)
  if (l.kind == 2 or l.kind == CAL) and not short then return c >= 0 end
  if c <= 0 then return false end
  local k = 0
  if short then
    local r
    k, r = divmod(need, l.rate)
    if r ~= 0 then k = add(k, 1) end
  end
  if l.kind == 1 then k = add(k, 1) end
  return cmp((divmod(tdiff(nows, nown, s, n), l.period)), k) >= 0
end

-- refilled is the bucket (tokens, s, n) brought forward to now.
local function refilled(l, nows, nown, tokens, s, n)
  if tcmp(nows, nown, s, n) <= 0 then
    if cmp(tokens, l.burst) > 0 then return l.burst, s, n end
    return tokens, s, n
  end
  local e = tdiff(nows, nown, s, n)
  local missing = sub(l.burst, tokens)
  if l.kind == 0 then
    if cmp(missing, 0) <= 0 then return l.burst, nows, nown end
    -- floor(e*rate/period) and floor(((e*rate) mod period) / rate), in
    -- the reduced rate and period: the same numbers, smaller operands.
    local gained, rem = divmod(mul(e, l.crate), l.cperiod)
    if cmp(gained, missing) >= 0 then return l.burst, nows, nown end
    local back = divmod(rem, l.crate)
    local ts, tn = tadd(nows, nown, neg(back))
    return add(tokens, gained), ts, tn
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
  local k = p / cp
  k = k - k % 1 -- floor, without a function call
  local rem = p - k * cp
  if rem < 0 then
    k, rem = k - 1, rem + cp
  elseif rem >= cp then
    k, rem = k + 1, rem - cp
  end
  if k >= missing then return l.burst, nows, nown end
  local back = rem / cr
  back = back - back % 1
  local r = rem - back * cr
  if r < 0 then
    back = back - 1
  elseif r >= cr then
    back = back + 1
  end
  -- ts = now - back, back < 2^52
  local nn = nown - back
  if nn >= 0 then return tokens + k, nows, nn end
  local c = floor(nn / NS)
  nn = nn - c * NS
  if nn < 0 then
    c, nn = c - 1, nn + NS
  elseif nn >= NS then
    c, nn = c + 1, nn - NS
  end
  return tokens + k, nows + c, nn
end

-- keep is how long, in milliseconds of real time, a bucket must be kept:
-- an estimate in doubles of ExpiresAt - now, rounded up generously, plus
-- a minute (as memstore's sweeper keeps a bucket a minute past expiry,
-- for clocks that step back a little). Decisions do not rest on it
-- (expired does that exactly), only memory does.
local function keep(l, nows, nown, tokens, s, n)
  local x
  if l.fast and l.kind == 0 and type(tokens) == 'number' then
    x = (s - nows) * NS + (n - nown)
    local need = l.burst - tokens
    if need > 0 then x = x + need * l.period / l.rate end
  else
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
    x = todouble(tdiff(s, n, nows, nown)) + d
  end
  if x < 0 then x = 0 end
  local ms = x / 1e6 * (1 + 1e-9)
  ms = ms - ms % 1 + 60001 -- at least ceil(ms) + a minute
  if ms > 1e15 then ms = 1e15 end
  return ms
end

-- U32 is 2^32, the bound of the compact forms' s and deadline; I31 is
-- 2^31, the short form's bound on tokens and its mark.
local U32, I31 = 4294967296, 2147483648

-- TTLKEY is a bucket's TTL deadline when its form does not hold it (the
-- short form): the key's own TTL, read (ttlEnd) only when a write needs it.
local TTLKEY = -1

-- packBucket is a bucket in binary (tokens nt a plain number, below 2^52
-- in magnitude; dl the TTL deadline in milliseconds). The short form, 12
-- bytes, when tokens fit in 32 bits and s in [0, 2^32): n plus 2^31 (a
-- first byte of 128 or more, which no other form starts with), s, and
-- the tokens, as big-endian 32-bit integers, without the deadline (the
-- key's TTL holds it). Redis keeps a value of up to 12 bytes with its
-- object in one 32-byte allocation (jemalloc's classes go 16, 32, 48,
-- 64), against 48 for the 20 bytes of the compact form, written when the
-- tokens do not fit: the byte 1, tokens in 7 bytes, s, n and the
-- deadline in whole seconds, rounded down (0 when out of its range:
-- unknown), little-endian. Else the binary form of earlier versions.
local function packBucket(nt, s, n, dl)
  if s >= 0 and s < U32 then
    if nt >= -I31 and nt < I31 then
      return pack('>I4I4i4', n + I31, s, nt)
    end
    local d = dl / 1000
    d = d - d % 1
    if not (d > 0 and d < U32) then d = 0 end
    return pack('<Bi7I4I4I4', 1, nt, s, n, d)
  end
  return pack('<Bdddd', 0, nt, s, n, dl)
end

-- unpackShort reads the short form: tokens, s, n and TTLKEY.
local function unpackShort(v)
  local w, s, tok = unpack('>I4I4i4', v)
  return tok, s, w - I31, TTLKEY
end

-- ttlEnd is the TTL deadline dl as stored, or the key's own when the form
-- does not hold it (TTLKEY; nil when the key has no TTL or none).
local function ttlEnd(key, dl, srvms)
  if dl ~= TTLKEY then return dl end
  local p = rcall('PTTL', key)
  if p > 0 then return srvms + p end
  return nil
end

-- unpackCompact reads the compact form: tokens, s, n and the deadline in
-- milliseconds (nil: unknown).
local function unpackCompact(v)
  local tok, s, n, d = unpack('<xi7I4I4I4', v)
  if d > 0 then return tok, s, n, d * 1000 end
  return tok, s, n, nil
end

-- load reads a bucket's value (v: GET's answer, a string or false): flags
-- (4: found, else 0), the tokens as stored (a number, or the decimal
-- string), s, n and the TTL deadline as stored, the tokens as an integer
-- (nil: not found), and the text of the key's blocks after the bucket
-- (nil: none; see decideBlocks).
local function load(v)
  if not v then return 0, 0, 0, 0, nil, nil, nil end
  local b1 = byte(v, 1)
  if b1 >= 128 and #v >= 12 then
    local tok, os, on, dl = unpackShort(v)
    local rest
    if #v > 13 then rest = ssub(v, 14) end
    return 4, tok, os, on, dl, tok, rest
  end
  if b1 == 1 and #v >= 20 then
    local tok, os, on, dl = unpackCompact(v)
    local rest
    if #v > 21 then rest = ssub(v, 22) end
    return 4, tok, os, on, dl, tok, rest
  end
  if b1 == 0 and #v >= 33 then
    -- Binary: tokens, s, n, deadline as doubles (tokens below 2^53).
    local tok, os, on, dl = unpack('<xdddd', v)
    local rest
    if #v > 34 then rest = ssub(v, 35) end
    return 4, tok, os, on, dl, tok, rest
  end
  local rest
  local nl = find(v, '\n', 1, true)
  if nl then v, rest = ssub(v, 1, nl - 1), ssub(v, nl + 1) end
  local x, y, z, d = match(v, '^(%-?%d+) (%-?%d+) (%d+) ?(%d*)$')
  if not x then return 0, 0, 0, 0, nil, nil, nil end
  local tok = tonumber(x)
  if not (tok < HALF and tok > -HALF) then tok = parse(x) end
  return 4, x, tonumber(y), tonumber(z), tonumber(d), tok, rest
end

-- bring is the bucket (tokens tok, nil when not found, at s, n) as
-- bucket.Eval sees it before its op at now: refilled to now, or fresh.
local function bring(l, tok, s, n, nows, nown)
  if l.kind == CAL and tcmp(nows, nown, l.ss, l.sn) < 0 then
    -- A clock behind the calendar window's start decides at it.
    nows, nown = l.ss, l.sn
  end
  if tok ~= nil then
    if l.kind == CAL and tcmp(s, n, l.ss, l.sn) < 0 then
      tok = nil -- a state from an earlier calendar window: fresh
    elseif l.kind ~= 0 then
      if expired(l, nows, nown, tok, s, n) then
        tok = nil
      else
        tok, s, n = refilled(l, nows, nown, tok, s, n)
      end
    else
      local t2, s2, n2
      if l.fast and type(tok) == 'number' and tok < HALF and tok > -HALF then
        t2, s2, n2 = refilledFast(l, nows, nown, tok, s, n)
      end
      if t2 then
        tok, s, n = t2, s2, n2
      else
        tok, s, n = refilled(l, nows, nown, tok, s, n)
      end
    end
  end
  if tok == nil then
    -- Fresh; refilling a fresh bucket at now changes nothing.
    return fresh(l, nows, nown)
  end
  return tok, s, n
end

-- applyOp is op on the tokens tok (brought to now) under l, as
-- bucket.Eval decides it: whether it is allowed, and the tokens after.
local function applyOp(l, op, tok)
  local cost = l.cost
  if op == REFUND then
    local nt = add(tok, cost)
    if cmp(nt, l.burst) > 0 then nt = l.burst end
    return true, nt
  elseif (type(tok) == 'number' and type(cost) == 'number' and tok >= cost) or cmp(tok, cost) >= 0 then
    return true, sub(tok, cost)
  elseif l.reserve and (cmp(l.maxr, 0) < 0 or cmp(sub(cost, tok), l.maxr) <= 0) then
    return true, sub(tok, cost)
  end
  return false, tok
end

-- decide decides one request (op, under shape l) on a bucket read with
-- GET (v: redis.pcall's answer), without writing. It returns flags (1:
-- allowed, 4: found, 8: the key holds another type, so nothing is
-- decided or written for it), the stored tokens, s, n and deadline (if
-- found), and the bucket after (tokens, s, n).
local function decide(v, l, op, nows, nown)
  if type(v) == 'table' and v.err then
    return 8, 0, 0, 0, nil, 0, 0, 0
  end
  local flags, otok, os, on, dl, tok = load(v)
  local s, n
  tok, s, n = bring(l, tok, os, on, nows, nown)
  local ok, nt = applyOp(l, op, tok)
  if ok then flags = flags + 1 end
  return flags, otok, os, on, dl, nt, s, n
end

-- write stores a bucket. A TTL that already lasts long enough is kept
-- (SET ... KEEPTTL costs about half of setting one); otherwise the TTL is
-- set a minute longer than needed, so the next writes can keep it. srvms
-- is the server's clock in milliseconds, the frame of TTL deadlines. sfx
-- (nil: none) follows the bucket in the value: its blocks (writeBlocks),
-- which want to be kept want milliseconds (nil: as the bucket alone).
local function write(key, l, nows, nown, dl, nt, s, n, srvms, sfx, want)
  want = want or keep(l, nows, nown, nt, s, n)
  dl = ttlEnd(key, dl, srvms)
  local keepttl = dl and dl >= srvms + want
  local px
  if not keepttl then
    px = want + 60000
    dl = srvms + px
  end
  local v
  if type(nt) == 'number' then
    -- Compact or binary (a plain number is exact): a first byte (1 or 0)
    -- no decimal starts with. Packing and unpacking cost a fraction of
    -- formatting and matching decimals.
    if nt == 0 then nt = 0 end -- not -0
    v = packBucket(nt, s, n, dl)
  else
    v = str(nt) .. format(' %d %d %.0f', s, n, dl)
  end
  if sfx then v = v .. sfx end
  if keepttl then
    rcall('SET', key, v, 'KEEPTTL')
  else
    rcall('SET', key, v, 'PX', format('%.0f', px))
  end
end

-- writeFast is write for a continuous refill's bucket of plain doubles
-- (l.fast, tokens nt below 2^53), with keep inlined: the same arithmetic
-- as keep's first branch and write's binary form. Calling them instead
-- cost about 6% more server CPU in the 64-caller bench (four alternating
-- runs each).
local function writeFast(key, l, nows, nown, nt, s, n, dl, srvms)
  if nt == 0 then nt = 0 end -- not -0
  local x = (s - nows) * NS + (n - nown)
  local need = l.burst - nt
  if need > 0 then x = x + need * l.period / l.rate end
  if x < 0 then x = 0 end
  local ms = x / 1e6 * (1 + 1e-9)
  ms = ms - ms % 1 + 60001
  if ms > 1e15 then ms = 1e15 end
  dl = ttlEnd(key, dl, srvms)
  if dl and dl >= srvms + ms then
    rcall('SET', key, packBucket(nt, s, n, dl), 'KEEPTTL')
  else
    local px = ms + 60000
    rcall('SET', key, packBucket(nt, s, n, srvms + px), 'PX', format('%.0f', px))
  end
end

-- fastRead is a take's bucket in the common case: missing (a fresh
-- bucket at now) or stored compact or in binary, with plain numbers,
-- refilled to now by refilledFast. It returns nil when the case is not that one; else the
-- tokens, s and n at now, the stored TTL deadline (nil: none), the flags
-- (4: found, else 0) and the stored tokens, s and n for the reply.
local function fastRead(v, l, nows, nown)
  if v == false then -- no key
    return l.burst, nows, nown, nil, 0, 0, 0, 0
  end
  if type(v) ~= 'string' then return nil end
  local tok, s, n, dl
  local len, b1 = #v, byte(v, 1)
  if len == 12 and b1 >= 128 then
    tok, s, n, dl = unpackShort(v)
  elseif len == 20 and b1 == 1 then
    tok, s, n, dl = unpackCompact(v)
  elseif len == 33 and b1 == 0 then
    tok, s, n, dl = unpack('<xdddd', v)
  else
    return nil
  end
  if not (tok < HALF and tok > -HALF) then return nil end
  local otok, os, on = tok, s, n
  local t2, s2, n2 = refilledFast(l, nows, nown, tok, s, n)
  if t2 then
    tok, s, n = t2, s2, n2
  elseif nows > s or (nows == s and nown > n) then
    return nil
  elseif tok > l.burst then
    tok = l.burst
  end
  return tok, s, n, dl, 4, otok, os, on
end

-- takeFast decides and writes a take in the common case: a continuous
-- refill whose numbers are plain doubles (l.fast, a plain cost), a bucket
-- missing or stored in binary (fastRead), and no reservation needed. It
-- returns nil when the case is not that one, and decide and write do the
-- work.
local function takeFast(key, v, l, nows, nown, srvms)
  local tok, s, n, dl, flags, otok, os, on = fastRead(v, l, nows, nown)
  if not tok then return nil end
  if tok < l.cost then
    if l.reserve then return nil end
    return flags, otok, os, on
  end
  writeFast(key, l, nows, nown, tok - l.cost, s, n, dl, srvms)
  return flags + 3, otok, os, on
end

-- takeAllFast is an all-or-nothing multi-take (or a single take) of
-- requests first..last in the case takeFast handles, for every request:
-- it decides all, then writes all or nothing, as the general path does,
-- and puts the reply records in recs. It returns nil, having written
-- nothing, when any request is not that case (or is late), and the
-- general path decides them all. The general path costs a table per
-- request, load, bring, applyOp and keep with their generic branches,
-- write with its own: about twice the server's time of this one for two
-- keys (BENCHMARKS.md).
local function takeAllFast(KEYS, limits, reqs, first, last, srvs, srvn, srvus, srvms, recs)
  -- w: per request, 11 slots: l, nows, nown, tokens after, s, n, TTL
  -- deadline, flags, and the stored tokens, s, n for its record. Sized
  -- for two requests up front (an Envoy request of two descriptors): an
  -- empty table grown to 22 slots reallocates five times, which costs
  -- about as much as a GET.
  local w = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}
  local pos, all = first * REC - REC + 1, true
  for i = first, last do
    local sh, op, nows, nown, rdl
    sh, op, nows, nown, rdl, pos = unpack('<IBddd', reqs, pos)
    local l = limits[sh]
    if op >= JOINED then op = op - JOINED end
    if not l.fastTake or (op ~= TAKE and op ~= TAKE + 4) or (rdl > 0 and rdl <= srvus) then return nil end
    if op == TAKE then nows, nown = srvs, srvn end
    local tok, s, n, dl, flags, otok, os, on = fastRead(rpcall('GET', KEYS[i]), l, nows, nown)
    if not tok then return nil end
    if tok >= l.cost then
      flags = flags + 1
    elseif l.reserve then
      return nil
    else
      all = false
    end
    local b = (i - first) * 11
    w[b + 1], w[b + 2], w[b + 3], w[b + 4], w[b + 5], w[b + 6], w[b + 7], w[b + 8], w[b + 9], w[b + 10], w[b + 11] =
      l, nows, nown, tok - l.cost, s, n, dl, flags, otok, os, on
  end
  for i = first, last do
    local b = (i - first) * 11
    local flags = w[b + 8]
    if all then
      writeFast(KEYS[i], w[b + 1], w[b + 2], w[b + 3], w[b + 4], w[b + 5], w[b + 6], w[b + 7], srvms)
      flags = flags + 2
    end
    recs[i] = pack('<Bddd', flags, w[b + 9], w[b + 10], w[b + 11])
  end
  return true
end

-- Blocks of leased tokens (bucket.EvalBlocks) live in their bucket's own
-- value, after the bucket and a newline: per block, its ID (printable
-- ASCII, no spaces), size (micro-tokens) and expiry (s and n, in the
-- requests' frame), all separated by spaces. A key without live blocks
-- holds the bucket alone, so the common path never reads a block; a plain
-- request on a key with blocks is decided under their cap like a block's.
local MAXBLOCKS = 64 -- bucket.MaxBlocks

-- hasBlocks reports a bucket's value (a string) with blocks after it.
local function hasBlocks(v)
  local b1 = byte(v, 1)
  if b1 >= 128 then return #v > 12 end
  if b1 == 1 then return #v > 20 end
  if b1 == 0 then return #v > 33 end
  return find(v, '\n', 1, true) ~= nil
end

-- blockArg reads a block request's argument: "id ttl".
local function blockArg(a)
  local id, ttl = match(a, '^(%S+) (%d+)$')
  if not id then error('drip: bad block: ' .. a) end
  return id, tonumber(ttl)
end

-- capped is l with its burst lowered by the outstanding tokens o (not
-- below 0): bucket.Params.capped.
local function capped(l, o)
  if o == 0 then return l end
  local c = {}
  for k, x in pairs(l) do c[k] = x end
  local b = sub(l.burst, o)
  if cmp(b, 0) < 0 then b = 0 end
  c.burst = b
  return c
end

-- decideBlocks decides a request on a key whose value v (GET's answer)
-- may hold blocks, as bucket.EvalBlocks does: bid is the request's block
-- ID (nil for a plain request) and bttl a block take's life in
-- nanoseconds. It writes nothing; it returns flags (1 allowed, 4 found, 8
-- another type), the stored tokens, s and n, the blocks text as stored
-- ('' for none), and what to write ({dl, tokens, s, n, live blocks}), nil
-- when nothing is.
local function decideBlocks(v, l, op, nows, nown, bid, bttl)
  if type(v) == 'table' and v.err then return 8, 0, 0, 0, '', nil end
  local flags, otok, os, on, dl, tok, btxt = load(v)
  btxt = btxt or ''
  local s, n = os, on
  -- Advance: through the expiries of the blocks, in order, each refill
  -- under the cap of the blocks live until then.
  local live, done, o = {}, {}, 0
  for id, sz, es, en in gmatch(btxt, '(%S+) (%d+) (%-?%d+) (%d+)') do
    local b = {id, parse(sz), tonumber(es), tonumber(en)}
    o = add(o, b[2])
    if tcmp(b[3], b[4], nows, nown) <= 0 then done[#done + 1] = b else live[#live + 1] = b end
  end
  local q = capped(l, o)
  if #done > 0 then
    sort(done, function(x, y) return tcmp(x[3], x[4], y[3], y[4]) < 0 end)
    for k = 1, #done do
      local b = done[k]
      local ts, tn = b[3], b[4]
      if l.kind ~= 0 then ts, tn = tadd(ts, tn, -1) end -- before the grid point's refill
      tok, s, n = bring(q, tok, s, n, ts, tn)
      if cmp(tok, q.burst) > 0 then tok = q.burst end -- a refund of nothing
      o = sub(o, b[2])
      q = capped(l, o)
    end
  end
  tok, s, n = bring(q, tok, s, n, nows, nown)
  local nt, w = tok, false
  if not bid or op == PEEK then
    local ok
    ok, nt = applyOp(q, op, tok)
    if ok then
      flags = flags + 1
      w = op ~= PEEK
    end
  else
    local i
    for k = 1, #live do
      if live[k][1] == bid then i = k end
    end
    if op == TAKE then
      if i then
        -- Live already: nothing more taken (a peek of nothing).
        if cmp(tok, 0) >= 0 then flags = flags + 1 end
      elseif #live < MAXBLOCKS and cmp(tok, l.cost) >= 0 then
        flags, w, nt = flags + 1, true, sub(tok, l.cost)
        -- bucket.Params.BlockExp: now + ttl, and a fixed window's block
        -- ends with its window.
        local es, en = tadd(nows, nown, bttl)
        if l.kind == 2 then
          local ws, wn = tadd(s, n, l.period)
          if tcmp(ws, wn, es, en) < 0 then es, en = ws, wn end
        end
        live[#live + 1] = {bid, l.cost, es, en}
      end
    else -- REFUND: the block's unused tokens back, capped
      flags = flags + 1
      if cmp(tok, q.burst) > 0 then nt = q.burst end
      if i then
        local b = table.remove(live, i)
        local back = l.cost
        if cmp(back, b[2]) > 0 then back = b[2] end
        local cb = add(q.burst, b[2])
        nt = add(nt, back)
        if cmp(nt, cb) > 0 then nt = cb end
        w = true
      end
    end
  end
  if not w then return flags, otok, os, on, btxt, nil end
  return flags, otok, os, on, btxt, {dl, nt, s, n, live}
end

-- writeBlocks stores what decideBlocks decided (st), the live blocks
-- after the bucket. The key is kept until every block has expired and the
-- bucket, refilled under their caps, is full again: at most the last
-- expiry plus the time the bucket takes to refill from its tokens less
-- the outstanding ones (bucket.Params.StateExpiresAt, estimated above).
local function writeBlocks(key, l, nows, nown, st, srvms)
  local live = st[5]
  if #live == 0 then return write(key, l, nows, nown, st[1], st[2], st[3], st[4], srvms) end
  local parts, o, ls, ln = {}, 0, nows, nown
  for k = 1, #live do
    local b = live[k]
    parts[k] = b[1] .. ' ' .. str(b[2]) .. format(' %.0f %.0f', b[3], b[4])
    o = add(o, b[2])
    if tcmp(b[3], b[4], ls, ln) > 0 then ls, ln = b[3], b[4] end
  end
  local want = keep(l, nows, nown, sub(st[2], o), nows, nown) + ceil(todouble(tdiff(ls, ln, nows, nown)) / 1e6)
  write(key, l, nows, nown, st[1], st[2], st[3], st[4], srvms, '\n' .. concat(parts, ' '), want)
end

-- Concurrency limits (kind 3): the key is a sorted set of lease IDs, each
-- scored by its expiry in whole microseconds (bucket.Params.LeaseExp
-- rounds it so; below 2^53, exact as a double), in the frame of the
-- requests' times. A lease is live while its expiry is after now. The
-- script reads what bucket.Leases summarizes, and the verdict is
-- bucket.Params.EvalLeases's (the Go side checks it): allowed when the
-- request's lease is live already or fewer leases than slots are live.
-- The record of a lease request holds flags (1 allowed, 2 written, 4 some
-- lease live, 8 another type, 64 the request's lease is live), the live
-- leases, and the earliest and latest expiry among them.
local LEASE = 3

-- usNow is now (s, n) in whole microseconds, rounded down.
local function usNow(nows, nown) return nows * 1000000 + (nown - nown % 1000) / 1000 end

-- leaseExp is bucket.Params.LeaseExp: now + TTL, rounded up to a whole
-- microsecond. (The TTL is at most a day, so nown + TTL is exact.)
local function leaseExp(l, nows, nown)
  local a = nown + l.period
  local r = a % 1000
  local e = nows * 1000000 + (a - r) / 1000
  if r > 0 then e = e + 1 end
  return e
end

-- readLeases reads the set at key for lease id at now (microseconds),
-- and writes nothing: flags (4, 8, 64 as above), live, earliest, latest.
local function readLeases(key, id, nowus)
  local from = '(' .. format('%.0f', nowus)
  local live = rpcall('ZCOUNT', key, from, '+inf')
  if type(live) == 'table' then
    -- A string is a bucket's or a sliding window's: no leases.
    if rcall('TYPE', key).ok == 'string' then return 0, 0, 0, 0 end
    return 8, 0, 0, 0
  end
  if live == 0 then return 0, 0, 0, 0 end
  local flags = 4
  if id ~= '' then
    local sc = rcall('ZSCORE', key, id)
    if sc and tonumber(sc) > nowus then flags = flags + 64 end
  end
  local e = rcall('ZRANGEBYSCORE', key, from, '+inf', 'LIMIT', 0, 1, 'WITHSCORES')
  local t = rcall('ZRANGE', key, -1, -1, 'WITHSCORES')
  return flags, live, tonumber(e[2]), tonumber(t[2])
end

-- decideLeases reads the set and adds flag 1 when op is allowed.
local function decideLeases(key, l, op, id, nows, nown)
  local flags, live, e, t = readLeases(key, id, usNow(nows, nown))
  if flags ~= 8 and (op == REFUND or flags >= 64 or live < l.slots) then flags = flags + 1 end
  return flags, live, e, t
end

-- writeLeases writes an allowed take (the lease added, or its expiry
-- renewed) or a refund (the lease removed), dropping expired leases
-- first. The key lives a minute past its latest expiry; an empty set is
-- no key at all.
local function writeLeases(key, l, op, id, nows, nown, latest)
  local nowus = usNow(nows, nown)
  if type(rpcall('ZREMRANGEBYSCORE', key, '-inf', format('%.0f', nowus))) == 'table' then
    -- A string (readLeases found no leases): a release leaves it, an
    -- acquire replaces it.
    if op == REFUND then return end
    rcall('DEL', key)
  end
  if op == REFUND then
    rcall('ZREM', key, id)
    return
  end
  local e = leaseExp(l, nows, nown)
  rcall('ZADD', key, format('%.0f', e), id)
  if e > latest then latest = e end
  local us = latest - nowus
  if us < 0 then us = 0 end
  rcall('PEXPIRE', key, format('%.0f', (us - us % 1000) / 1000 + 60001))
end

-- Sliding windows (kind 4): the key is a string, "+" then decimals,
-- "last c1 ... cn": the newest slot written and a count per slot for the
-- last n = slots+1 slots (bucket.SlidingState). The shape carries the
-- slot's length in nanoseconds as its rate, the number of slots as its start and
-- the offset of the slot grid from the epoch's (0 to slot-1) as its
-- max_reserved.
-- Counts are plain doubles (drip.Limit holds a sliding window to 1e9
-- tokens, 1e15 micro-tokens) and the slot index too (a slot is at least a
-- microsecond); the slot's length and the grid's offset are integers of
-- bigint.lua, tables when past 2^53 ns (about 104 days), and so is now
-- less the offset. The script decides as bucket.EvalSliding does and
-- replies with the state before, as a string after the records (flag
-- 128), from which the Go side recomputes the decision and checks the
-- script's.
local SLIDE = 4

-- A sliding window's value starts with "+" (SLIDETAG), which no
-- bucket's form starts with (a byte of 128 or more, 1, 0, a digit or
-- "-"): a key whose limit changes between a sliding window and a bucket
-- finds a state of another shape, which counts as none
-- (docs/semantics.md, "When a limit changes"). Versions before the tag
-- read "+last" as the number last, and a bucket as none.
local SLIDETAG = '+'

-- slidingBody is the sliding window's state "last c1 ... cn" in the
-- value v (a string), or nil when v holds a bucket. A value without the
-- tag was written before it, in decimals only; one whose first number is
-- 2^53 or more in magnitude is a bucket's decimal form (a slot index is
-- smaller until the year 2255).
local function slidingBody(v)
  if byte(v, 1) == 43 then return ssub(v, 2) end
  if not find(v, '^%-?%d+[%d ]*$') then return nil end
  local first = tonumber(match(v, '^%-?%d+'))
  if first >= SAFE or first <= -SAFE then return nil end
  return v
end

-- decideSliding decides op on the state v (GET's answer) at now. It
-- returns flags (1 allowed, 4 found, 8 another type), the state before as
-- stored without its tag ("" when none, or a bucket's) and the state
-- after {last, counts}.
local function decideSliding(v, l, op, nows, nown)
  if type(v) == 'table' and v.err then return 8, '', nil end
  local n = l.slots + 1
  local j = divmod(sub(add(mul(nows, NS), nown), l.maxr), l.slot)
  local flags, before, last, counts = 0, '', nil, {}
  if v then v = slidingBody(v) end
  if v then
    flags, before = 4, v
    for x in gmatch(v, '%-?%d+') do
      if last == nil then last = tonumber(x) else counts[#counts + 1] = tonumber(x) end
    end
  end
  local cur = {}
  for i = 1, n do cur[i] = 0 end
  if last and #counts == n then
    if j < last then j = last end -- a clock that went back moves nothing
    local d = j - last
    if d < n then
      for i = 1, n - d do cur[i] = counts[i + d] end
    end
  end
  local used = 0
  for i = 1, n do used = used + cur[i] end
  local cost = l.cost
  if type(cost) ~= 'number' then cost = HALF end -- a refund above anything counted
  if op == REFUND then
    for i = n, 1, -1 do
      if cost <= 0 then break end
      local give = cur[i] < cost and cur[i] or cost
      cur[i], cost = cur[i] - give, cost - give
    end
    flags = flags + 1
  elseif used + cost <= l.burst then
    cur[n] = cur[n] + cost
    flags = flags + 1
  end
  return flags, before, {j, cur}
end

-- writeSliding stores the state st, for as long as its newest count is
-- counted (an estimate in doubles, plus a minute). A slot may be longer
-- than 2^53 ns (a table): its estimate is a double all the same.
local function writeSliding(key, l, st)
  local parts = {format('%.0f', st[1])}
  for i = 1, #st[2] do parts[i + 1] = format('%.0f', st[2][i]) end
  local ms = (l.slots + 2) * todouble(l.slot) / 1e6
  ms = ms - ms % 1 + 60001
  rcall('SET', key, SLIDETAG .. concat(parts, ' '), 'PX', format('%.0f', ms))
end

-- noState is GET's failed answer v on key as a bucket or a sliding
-- window reads it: none (false) when the key holds a concurrency limit's
-- leases (a sorted set), a state of another shape; else v, the error (the
-- key holds a type drip never writes).
local function noState(key, v)
  if rcall('TYPE', key).ok == 'zset' then return false end
  return v
end

-- parseShape reads a shape: "kind rate period crate cperiod burst
-- max_reserved start cost reserve".
local function parseShape(txt)
  local k, r, p, cr, cp, b, m, st, c, res = match(txt,
    '^(%d) (%d+) (%d+) (%d+) (%d+) (%d+) (%-?%d+) (%-?%d+) (%d+) ([01])$')
  if not k then error('drip: bad shape: ' .. txt) end
  local t = {
    kind = tonumber(k), rate = parse(r), period = parse(p), crate = parse(cr), cperiod = parse(cp),
    burst = parse(b), maxr = parse(m), start = parse(st), cost = parse(c), reserve = res == '1',
  }
  t.fast = type(t.rate) == 'number' and type(t.period) == 'number' and type(t.burst) == 'number'
    and t.burst < HALF and t.period < HALF and t.crate < HALF and t.cperiod < HALF
  t.fastTake = t.fast and t.kind == 0 and type(t.cost) == 'number' and t.cost < HALF
  if t.kind == LEASE then t.slots = t.burst / 1000000 end
  if t.kind == CAL then t.ss, t.sn = divmod(t.start, NS) end
  if t.kind == SLIDE then t.slot, t.slots = t.rate, t.start end
  return t
end

-- Parsed shapes, by their text, for the calls to come: a function library
-- keeps them (a script starts afresh every call). Nothing changes a shape
-- once parsed. Bounded: past 4096 shapes the cache starts over.
local shapeCache, shapeCount = {}, 0

-- shapes reads the call's shapes, ARGV[3..2+S], and returns them, the
-- packed requests, and the index in ARGV before the lease IDs (one per
-- request on a concurrency limit, in order, after the packed requests).
local function shapes(ARGV)
  local nl = tonumber(ARGV[2])
  local limits = {}
  for i = 1, nl do
    local txt = ARGV[2 + i]
    local t = shapeCache[txt]
    if not t then
      t = parseShape(txt)
      if shapeCount >= 4096 then shapeCache, shapeCount = {}, 0 end
      shapeCache[txt], shapeCount = t, shapeCount + 1
    end
    limits[i] = t
  end
  return limits, ARGV[3 + nl], 3 + nl
end

-- record appends request i's reply record to recs (and its tokens to
-- big, beyond 2^53).
local function record(recs, big, i, flags, otok, os, on)
  if type(otok) ~= 'number' then
    local x = tonumber(otok)
    if type(otok) == 'string' and x and x < SAFE and x > -SAFE then
      otok = x
    else
      big[#big + 1] = type(otok) == 'string' and otok or str(otok)
      flags, otok = flags + 16, 0
    end
  end
  recs[i] = pack('<Bddd', flags, otok, os, on)
end

-- skipArgs is li past the lease IDs and blocks of requests first..last
-- (from li0, the index before them): for requests not decided.
local function skipArgs(limits, reqs, first, last, li0)
  for i = first, last do
    local sh, op = unpack('<IB', reqs, i * REC - REC + 1)
    if op >= JOINED then op = op - JOINED end
    if op >= 8 or limits[sh].kind == LEASE then li0 = li0 + 1 end
  end
  return li0
end

-- together decides requests first..last together: one request, or a
-- multi-take all or nothing. mode is their op, 'take', 'peek' or
-- 'refund'; li is the index in ARGV before their lease IDs and blocks.
-- It puts their records in recs (and what goes in big, in order), and
-- returns li past them.
local function together(KEYS, ARGV, limits, reqs, first, last, li, mode, srvs, srvn, srvus, srvms, recs, big)
  if mode == 'take' and takeAllFast(KEYS, limits, reqs, first, last, srvs, srvn, srvus, srvms, recs) then
    return li -- (no leases or blocks on that path)
  end
  local li0, pos = li, first * REC - REC + 1
  -- request reads the next record of the packed requests: its shape, op
  -- and time.
  local function request()
    local sh, op, ts, tn, dl
    sh, op, ts, tn, dl, pos = unpack('<IBddd', reqs, pos)
    local late = dl > 0 and dl <= srvus
    if op >= JOINED then op = op - JOINED end
    local blk = op >= 8
    if blk then op = op - 8 end
    if op >= 4 then return limits[sh], op - 4, ts, tn, late, blk end
    return limits[sh], op, srvs, srvn, late, blk
  end

  -- One request, or a multi-take: decide all, then write all or nothing
  -- (nothing at all when a key holds another type).
  local all, bad = true, false
  local res = {}
  for i = first, last do
    local l, op, nows, nown, late, blk = request()
    if late then
      -- The caller gave up: nothing is decided or written.
      for j = first, last do recs[j] = pack('<Bddd', 32, 0, 0, 0) end
      return skipArgs(limits, reqs, first, last, li0)
    end
    local r
    if l.kind == LEASE then
      li = li + 1
      r = {l, nows, nown, decideLeases(KEYS[i], l, op, ARGV[li], nows, nown)}
      -- r: l, nows, nown, flags, live, earliest, latest, then the lease
      -- and its op
      r[8], r[9] = ARGV[li], op
    elseif l.kind == SLIDE then
      local v = rpcall('GET', KEYS[i])
      if type(v) == 'table' then v = noState(KEYS[i], v) end
      local flags, before, st = decideSliding(v, l, op, nows, nown)
      r = {l, nows, nown, flags, before, st}
    else
      local v = rpcall('GET', KEYS[i])
      if type(v) == 'table' then v = noState(KEYS[i], v) end
      if blk or (type(v) == 'string' and #v > 12 and hasBlocks(v)) then
        local bid, bttl
        if blk then
          li = li + 1
          bid, bttl = blockArg(ARGV[li])
        end
        -- r: l, nows, nown, flags, otok, os, on, blocks text, what to
        -- write (nil: nothing)
        r = {l, nows, nown, decideBlocks(v, l, op, nows, nown, bid, bttl)}
        r.blocks = true
      else
        r = {l, nows, nown, decide(v, l, op, nows, nown)}
        -- r: l, nows, nown, flags, otok, os, on, dl, nt, s, n
      end
    end
    if r[4] % 2 == 0 then all = false end
    if r[4] % 16 >= 8 then bad = true end
    res[i] = r
  end
  local doWrite = not bad and (mode == 'refund' or (mode == 'take' and all))
  for i = first, last do
    local r = res[i]
    if r[1].kind == SLIDE then
      if doWrite then
        writeSliding(KEYS[i], r[1], r[6])
        r[4] = r[4] + 2
      end
      big[#big + 1] = r[5]
      r[4], r[5], r[6], r[7] = r[4] + 128, 0, 0, 0
    elseif r.blocks then
      if doWrite and r[9] then
        writeBlocks(KEYS[i], r[1], r[2], r[3], r[9], srvms)
        r[4] = r[4] + 2
      end
      big[#big + 1] = r[8]
      r[4] = r[4] + 192
    elseif doWrite and r[1].kind == LEASE then
      writeLeases(KEYS[i], r[1], r[9], r[8], r[2], r[3], r[7])
      r[4] = r[4] + 2
    elseif doWrite then
      write(KEYS[i], r[1], r[2], r[3], r[8], r[9], r[10], r[11], srvms)
      r[4] = r[4] + 2
    end
    record(recs, big, i, r[4], r[5], r[6], r[7])
  end
  return li
end

-- main is one call: it decides the requests of KEYS and ARGV.
local function main(KEYS, ARGV)
  -- The server's clock: the time of decisions without one, and the frame
  -- of the keys' TTL deadlines.
  local srv = rcall('TIME')
  local srvs, srvn = tonumber(srv[1]), tonumber(srv[2]) * 1000
  local srvms = srvs * 1000 + floor(srvn / 1000000)
  local srvus = srvs * 1000000 + tonumber(srv[2])
  local mode = ARGV[1]
  local limits, reqs, li = shapes(ARGV)
  local recs, big = {}, {}
  if mode ~= 'batch' then
    -- One request, or a multi-take: decide all, then write all or
    -- nothing (nothing at all when a key holds another type).
    together(KEYS, ARGV, limits, reqs, 1, #KEYS, li, mode, srvs, srvn, srvus, srvms, recs, big)
  else
    -- Each request on its own, in order: a later request on the same key
    -- sees the earlier one's write. Requests joined (a multi-take) are
    -- decided together, all or nothing, in their place.
    -- (The single requests' path inlined: this loop is the hot path.)
    local i, nk, pos = 1, #KEYS, 1
    while i <= nk do
      local key, sh, op, nows, nown, dl = KEYS[i]
      sh, op, nows, nown, dl, pos = unpack('<IBddd', reqs, pos)
      local l = limits[sh]
      if op >= JOINED then
        local j = i + 1
        while byte(reqs, j * REC - REC + 5) >= JOINED do j = j + 1 end
        op = op - JOINED
        if op >= 8 then op = op - 8 end
        if op >= 4 then op = op - 4 end
        local gmode = 'take'
        if op == PEEK then gmode = 'peek' elseif op == REFUND then gmode = 'refund' end
        li = together(KEYS, ARGV, limits, reqs, i, j, li, gmode, srvs, srvn, srvus, srvms, recs, big)
        i, pos = j + 1, j * REC + 1
      else
        local blk = op >= 8
        if blk then op = op - 8 end
        if op >= 4 then op = op - 4 else nows, nown = srvs, srvn end
        local flags, otok, os, on
        if l.kind == LEASE or blk then li = li + 1 end
        if dl > 0 and dl <= srvus then
          -- Late (its caller gave up): nothing decided, nothing written.
          flags, otok, os, on = 32, 0, 0, 0
        elseif l.kind == LEASE then
          flags, otok, os, on = decideLeases(key, l, op, ARGV[li], nows, nown)
          if flags % 2 == 1 and (op == REFUND or op == TAKE) then
            writeLeases(key, l, op, ARGV[li], nows, nown, on)
            flags = flags + 2
          end
        elseif l.kind == SLIDE then
          local before, st
          local v = rpcall('GET', key)
          if type(v) == 'table' then v = noState(key, v) end
          flags, before, st = decideSliding(v, l, op, nows, nown)
          if flags < 8 and (op == REFUND or (op == TAKE and flags % 2 == 1)) then
            writeSliding(key, l, st)
            flags = flags + 2
          end
          big[#big + 1] = before
          flags, otok, os, on = flags + 128, 0, 0, 0
        else
          -- pcall: a key of another type (WRONGTYPE) fails its own request
          -- only, not the others of a batch, some of which may be written.
          local v = rpcall('GET', key)
          if type(v) == 'table' then v = noState(key, v) end
          if blk or (type(v) == 'string' and #v > 12 and hasBlocks(v)) then
            local bid, bttl, btxt, st
            if blk then bid, bttl = blockArg(ARGV[li]) end
            flags, otok, os, on, btxt, st = decideBlocks(v, l, op, nows, nown, bid, bttl)
            if st then
              writeBlocks(key, l, nows, nown, st, srvms)
              flags = flags + 2
            end
            big[#big + 1] = btxt
            flags = flags + 192
          elseif op == TAKE and l.fastTake then
            flags, otok, os, on = takeFast(key, v, l, nows, nown, srvms)
          end
          if not flags then
            local kdl, nt, s, n
            flags, otok, os, on, kdl, nt, s, n = decide(v, l, op, nows, nown)
            if flags < 8 and (op == REFUND or (op == TAKE and flags % 2 == 1)) then
              write(key, l, nows, nown, kdl, nt, s, n, srvms)
              flags = flags + 2
            end
          end
        end
        if type(otok) == 'number' then
          recs[i] = pack('<Bddd', flags, otok, os, on)
        else
          record(recs, big, i, flags, otok, os, on)
        end
        i = i + 1
      end
    end
  end
  local out = {srvs, srvn, concat(recs)}
  for k = 1, #big do out[3 + k] = big[k] end
  return out
end

