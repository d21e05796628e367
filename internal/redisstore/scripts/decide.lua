-- decide.lua: decides every counter of one or more requests, each all or
-- nothing, in one atomic step on the Redis server; several requests in one
-- call share the script's per-call cost (redisstore's batching). It mirrors limit.Decide (Go) operation
-- for operation, in integers; a differential test holds them equal.
--
-- KEYS[i]  counter keys (on Cluster: all of one hash slot)
-- ARGV[1]  "0": read now from Redis TIME (what production always sends);
--          otherwise now in integer microseconds (tests only)
-- ARGV[2]  R, the number of requests; ARGV[3..2+R] the number of keys of
--          each, in KEYS order
-- then per key i, in order, 6 values:
--          limit, window_us, hits, flags (1 = refund, 2 = no veto: shadow),
--          algorithm (0 fixed window, 1 sliding window, 2 token bucket), burst
-- Values: fixed "<window_end_us>:<count>", sliding "<window_end_us>:<count>:<prev>",
-- token bucket "<tat_us>". A value that does not parse (a leaked or foreign
-- key) counts as absent and is rewritten or deleted here, so no key this
-- script touches is left without a TTL: every write is SET ... PX.
-- Returns, per key: over (0/1), remaining, us until reset; for every key
-- of a request a Redis command failed in (WRONGTYPE, OOM, NOREPLICAS,
-- ...): -1, the error, 0 — the other requests are unaffected.
-- Cost: O(#KEYS); one GET per key, at most one SET or DEL per key.
local now
if ARGV[1] == '0' then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
else
  now = tonumber(ARGV[1])
end
local GRACE = 1000000

-- Exact floor division of non-negative integers below 2^53: a double
-- quotient can round up across an integer.
local function idiv(a, b)
  local q = math.floor(a / b)
  if q * b > a then q = q - 1 elseif (q + 1) * b <= a then q = q + 1 end
  return q
end

local function windowEnd(win)
  return now - (now - idiv(now, win) * win) + win
end

local function parse(raw, algo)
  if not raw then return nil end
  if algo == 1 then
    local e, c, p = string.match(raw, '^(%d+):(%d+):(%d+)$')
    if e then return {e = tonumber(e), c = tonumber(c), p = tonumber(p)} end
  elseif algo == 2 then
    local t = string.match(raw, '^(%d+)$')
    if t then return {t = tonumber(t)} end
  else
    local e, c = string.match(raw, '^(%d+):(%d+)$')
    if e then return {e = tonumber(e), c = tonumber(c), p = 0} end
  end
  return nil
end

local function interval(lim, win) return idiv(win + lim - 1, lim) end
local function capacity(lim, burst, t)
  if burst == 0 then burst = lim end
  return burst * t
end
local function estimate(st, win)
  local ppm = idiv(st.e - now, win / 1000000)
  return st.c + idiv(st.p * ppm, 1000000)
end

-- A failed command ends its request, not the script.
local function rcall(...)
  local r = redis.pcall(...)
  if type(r) == 'table' and r.err then error(r, 0) end
  return r
end

local out = {}
-- decide decides the n keys from KEYS[k0+1] with their values from ARGV[a0].
local function decide(k0, a0, n)
  local cs, sts, raws, over = {}, {}, {}, {}
  local admitted = true
  for i = 1, n do
    local b = a0 + (i - 1) * 6
    local c = {lim = tonumber(ARGV[b]), win = tonumber(ARGV[b + 1]), hits = tonumber(ARGV[b + 2]),
      flags = tonumber(ARGV[b + 3]), algo = tonumber(ARGV[b + 4]), burst = tonumber(ARGV[b + 5])}
    c.refund = c.flags % 2 == 1
    cs[i] = c
    local raw = rcall('GET', KEYS[k0 + i])
    raws[i] = raw
    local st = parse(raw, c.algo)
    -- normalize
    if c.algo == 1 then
      local e = windowEnd(c.win)
      if st and st.e == e then
      elseif st and st.e == e - c.win then st = {e = e, c = 0, p = st.c}
      else st = {e = e, c = 0, p = 0} end
    elseif c.algo == 2 then
      local tat = 0
      if st then tat = st.t end
      if tat < now then tat = now end
      st = {t = tat}
    else
      local e = windowEnd(c.win)
      if not (st and st.e == e) then st = {e = e, c = 0, p = 0} end
    end
    sts[i] = st
    -- over
    local o = false
    if not c.refund then
      if c.algo == 1 then
        o = estimate(st, c.win) + c.hits > c.lim
      elseif c.algo == 2 then
        if c.lim == 0 then
          o = c.hits > 0
        else
          local t = interval(c.lim, c.win)
          local room = capacity(c.lim, c.burst, t) - (st.t - now)
          o = c.hits > 0 and (room < 0 or c.hits > idiv(room, t))
        end
      else
        o = st.c + c.hits > c.lim
      end
    end
    over[i] = o
    if o and c.flags < 2 then admitted = false end
  end

  for i = 1, n do
    local c, st = cs[i], sts[i]
    local consume = admitted and not over[i] and not c.refund
    local remaining, reset, expire, val = 0, 0, 0, nil
    if c.algo == 2 then
      if c.lim == 0 then
        reset = c.win
      else
        local t = interval(c.lim, c.win)
        if c.refund then
          if c.hits >= idiv(st.t - now + t - 1, t) then st.t = now else st.t = st.t - c.hits * t end
        elseif consume then
          st.t = st.t + c.hits * t
        end
        local cap = capacity(c.lim, c.burst, t)
        local room = cap - (st.t - now)
        if room > 0 then remaining = idiv(room, t) end
        if remaining == 0 then reset = st.t + t - cap - now end
        if reset < 0 then reset = 0 end
        if st.t > now then expire = st.t + GRACE end
        val = string.format('%d', st.t)
      end
    else
      if c.refund then
        st.c = st.c - c.hits
        if st.c < 0 then st.c = 0 end
      elseif consume then
        st.c = st.c + c.hits
      end
      reset = st.e - now
      if c.algo == 1 then
        local est = estimate(st, c.win)
        if est < c.lim then remaining = c.lim - est end
        if st.c > 0 or st.p > 0 then expire = st.e + c.win + GRACE end
        val = string.format('%d:%d:%d', st.e, st.c, st.p)
      else
        if st.c < c.lim then remaining = c.lim - st.c end
        if st.c > 0 then expire = st.e + GRACE end
        val = string.format('%d:%d', st.e, st.c)
      end
    end
    if expire == 0 then
      if raws[i] then rcall('DEL', KEYS[k0 + i]) end
    elseif val ~= raws[i] then
      rcall('SET', KEYS[k0 + i], val, 'PX', math.ceil((expire - now) / 1000))
    end
    if over[i] then out[#out + 1] = 1 else out[#out + 1] = 0 end
    out[#out + 1] = remaining
    out[#out + 1] = reset
  end
end

local R = tonumber(ARGV[2])
local k0, a0 = 0, 3 + R
for r = 1, R do
  local n = tonumber(ARGV[2 + r])
  local mark = #out
  local ok, err = pcall(decide, k0, a0, n)
  if not ok then
    for j = mark + 1, #out do out[j] = nil end
    local msg = err
    if type(err) == 'table' then msg = err.err end
    for _ = 1, n do
      out[#out + 1] = -1
      out[#out + 1] = tostring(msg)
      out[#out + 1] = 0
    end
  end
  k0, a0 = k0 + n, a0 + 6 * n
end
return out
