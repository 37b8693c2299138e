-- bigint.lua: exact integer arithmetic for drip's scripts.
--
-- Redis Lua numbers are IEEE doubles, exact for integers below 2^53 only,
-- while drip's state is int64 micro-tokens and nanoseconds, with 128-bit
-- intermediate products (elapsed * rate). An integer here is either a Lua
-- number, when its magnitude is below 2^53 (the fast path: plain double
-- arithmetic, exact there), or a table: sign-magnitude, limbs of base 2^24,
-- least significant first, with field neg. Every operation checks that a
-- fast-path result is exact and falls back to limbs when it may not be.
-- Values cross the script boundary as decimal strings (parse, str).
--
-- This file is a prefix of the other scripts: it defines locals only.

local B = 16777216 -- 2^24, the limb base
local SAFE = 9007199254740992 -- 2^53
local HALF = 4503599627370496 -- 2^52
local floor = math.floor
-- Globals as locals: a local is an array slot, a global a table lookup.
local type, tonumber, tostring, error = type, tonumber, tostring, error
local format, match, ceil = string.format, string.match, math.ceil
local POW10 = {10, 100, 1000, 10000, 100000, 1000000, 10000000}

-- tobig turns an exact integer (a number of any magnitude, or a table)
-- into limbs. Dividing a double by 2^24 is exact, so this is too.
local function tobig(x)
  if type(x) == 'table' then return x end
  local t = {neg = x < 0}
  if x < 0 then x = -x end
  local i = 0
  while x > 0 do
    local q = floor(x / B)
    i = i + 1
    t[i] = x - q * B
    x = q
  end
  return t
end

-- norm strips leading zero limbs and returns a number when the magnitude
-- is below 2^53.
local function norm(t)
  local n = #t
  while n > 0 and t[n] == 0 do
    t[n] = nil
    n = n - 1
  end
  if n <= 2 or (n == 3 and t[3] < 32) then
    local v = ((t[3] or 0) * B + (t[2] or 0)) * B + (t[1] or 0)
    if t.neg then return -v end
    return v
  end
  return t
end

-- Magnitude operations on limb arrays (the sign is ignored).
local function mcmp(a, b)
  if #a ~= #b then
    if #a < #b then return -1 end
    return 1
  end
  for i = #a, 1, -1 do
    if a[i] ~= b[i] then
      if a[i] < b[i] then return -1 end
      return 1
    end
  end
  return 0
end

local function madd(a, b)
  local r, c = {}, 0
  local n = #a
  if #b > n then n = #b end
  for i = 1, n do
    local s = (a[i] or 0) + (b[i] or 0) + c
    if s >= B then
      r[i] = s - B
      c = 1
    else
      r[i] = s
      c = 0
    end
  end
  if c > 0 then r[n + 1] = c end
  return r
end

-- msub returns |a| - |b| for |a| >= |b|.
local function msub(a, b)
  local r, c = {}, 0
  for i = 1, #a do
    local s = a[i] - (b[i] or 0) - c
    if s < 0 then
      r[i] = s + B
      c = 1
    else
      r[i] = s
      c = 0
    end
  end
  return r
end

-- mmul is schoolbook multiplication: every partial sum stays below
-- 2^24 + (2^24-1)^2 + 2^24 < 2^53.
local function mmul(a, b)
  local r = {}
  local na, nb = #a, #b
  for i = 1, na + nb do r[i] = 0 end
  for i = 1, na do
    local c, ai = 0, a[i]
    for j = 1, nb do
      local k = i + j - 1
      local s = r[k] + ai * b[j] + c
      c = floor(s / B)
      r[k] = s - c * B
    end
    r[i + nb] = c
  end
  return r
end

local function neg(a)
  if type(a) == 'number' then return -a end
  local r = {neg = not a.neg}
  for i = 1, #a do r[i] = a[i] end
  return r
end

local function add(a, b)
  if type(a) == 'number' and type(b) == 'number' then
    local s = a + b
    if s < SAFE and s > -SAFE then return s end
  end
  a, b = tobig(a), tobig(b)
  local r
  if a.neg == b.neg then
    r = madd(a, b)
    r.neg = a.neg
  else
    local c = mcmp(a, b)
    if c == 0 then return 0 end
    if c > 0 then
      r = msub(a, b)
      r.neg = a.neg
    else
      r = msub(b, a)
      r.neg = b.neg
    end
  end
  return norm(r)
end

local function sub(a, b)
  if type(a) == 'number' and type(b) == 'number' then
    local s = a - b
    if s < SAFE and s > -SAFE then return s end
  end
  return add(a, neg(b))
end

local function mul(a, b)
  if type(a) == 'number' and type(b) == 'number' then
    local p = a * b
    if p < SAFE and p > -SAFE then return p end
  end
  a, b = tobig(a), tobig(b)
  local r = mmul(a, b)
  r.neg = a.neg ~= b.neg
  return norm(r)
end

-- cmp returns -1, 0 or 1 as a <, =, > b.
local function cmp(a, b)
  if type(a) ~= 'number' or type(b) ~= 'number' then
    a = sub(a, b)
    b = 0
    if type(a) == 'table' then
      if a.neg then return -1 end
      return 1
    end
  end
  if a < b then return -1 end
  if a > b then return 1 end
  return 0
end

-- todouble is the nearest double, or nearly (a few ulps): for estimates.
local function todouble(a)
  if type(a) == 'number' then return a end
  local x = 0
  for i = #a, 1, -1 do x = x * B + a[i] end
  if a.neg then return -x end
  return x
end

-- divmod returns floor(a / b) and a - b * floor(a / b) for b > 0 (a of
-- either sign). Beyond the fast path it estimates the quotient in
-- doubles and corrects the remainder exactly until it lands in [0, b);
-- each round gains about 50 bits, so a 128-bit dividend takes three or
-- four.
local function divmod(a, b)
  if type(a) == 'number' and type(b) == 'number' and a < HALF and a > -HALF and b < HALF then
    local q = floor(a / b)
    local r = a - q * b
    if r < 0 then
      q = q - 1
      r = r + b
    elseif r >= b then
      q = q + 1
      r = r - b
    end
    return q, r
  end
  local q, r = 0, a
  local bd = todouble(b)
  while true do
    local lo = cmp(r, 0)
    if lo >= 0 and cmp(r, b) < 0 then return q, r end
    local est = floor(todouble(r) / bd)
    if est == 0 then
      if lo < 0 then est = -1 else est = 1 end
    end
    q = add(q, est)
    r = sub(r, mul(est, b))
  end
end

-- parse reads a decimal integer string exactly.
local function parse(s)
  local x = tonumber(s)
  if x == nil or x ~= floor(x) then
    return error('drip: not an integer: ' .. tostring(s))
  end
  if x < SAFE and x > -SAFE then return x end
  local negative = string.sub(s, 1, 1) == '-'
  local digits = s
  if negative then digits = string.sub(s, 2) end
  local t = {}
  local len = #digits
  local pos, w = 1, len % 7
  if w == 0 then w = 7 end
  while pos <= len do
    local c = tonumber(string.sub(digits, pos, pos + w - 1))
    local m = POW10[w]
    for i = 1, #t do
      local v = t[i] * m + c
      c = floor(v / B)
      t[i] = v - c * B
    end
    while c > 0 do
      local q = floor(c / B)
      t[#t + 1] = c - q * B
      c = q
    end
    pos = pos + w
    w = 7
  end
  t.neg = negative
  return norm(t)
end

-- str formats an integer as a decimal string.
local function str(a)
  if type(a) == 'number' then
    if a == 0 then return '0' end -- not '-0'
    return format('%.0f', a)
  end
  local t = {}
  for i = 1, #a do t[i] = a[i] end
  local parts = {}
  while #t > 0 do
    local r = 0
    for i = #t, 1, -1 do
      local v = r * B + t[i]
      local q = floor(v / 10000000)
      local m = v - q * 10000000
      if m < 0 then
        q = q - 1
        m = m + 10000000
      elseif m >= 10000000 then
        q = q + 1
        m = m - 10000000
      end
      t[i] = q
      r = m
    end
    while #t > 0 and t[#t] == 0 do t[#t] = nil end
    parts[#parts + 1] = r
  end
  local out = {}
  if a.neg then out[1] = '-' end
  out[#out + 1] = format('%.0f', parts[#parts])
  for i = #parts - 1, 1, -1 do out[#out + 1] = format('%07.0f', parts[i]) end
  return table.concat(out)
end
