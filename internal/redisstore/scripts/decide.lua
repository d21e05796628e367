-- decide.lua: decides every counter of one or more requests, each all or
-- nothing, in one atomic step on the Redis server; several requests in one
-- call share the script's per-call cost (redisstore's batching). It mirrors
-- limit.Decide (Go) operation for operation, in integers; a differential
-- test holds them equal.
--
-- KEYS[i]  counter keys (on Cluster: all of one hash slot)
-- ARGV[1]  "0": read now from Redis TIME (what production always sends);
--          otherwise now in integer microseconds (tests only)
-- ARGV[2]  R, the number of requests; ARGV[3..2+R] the number of keys of
--          each, in KEYS order; or -R when every request has one key,
--          and no counts follow (an argument a request fewer to read)
-- then Q, the number of distinct rules, and per rule 4 values:
--          limit, window_us, algorithm (0 fixed window, 1 sliding window,
--          2 token bucket) + 4 * calendar (0 none, 1 the UTC month, 2 the
--          UTC year: a fixed window's period) + 16 * the longest a budget
--          check stays in flight, in seconds (limit.Check.FlightS), burst
-- then P, the number of pair keys (KEYS after the counter keys: of each
--          check that carries a request id, in order)
-- then per counter key i, in order, 1 value:
--          hits * 2^20 + rule * 128 + flags (rule 1-based, below 2^13;
--          flags 1 = refund, 2 = no veto: shadow, 4 = usage (a rule
--          that takes usage after the fact), 8 = big: the hits, 2^32 or
--          more, are the value at that 1-based place of the list after
--          the keys' values; 16 * the usage kind (limit.UsageKind: 0 by
--          the hits: some a charge, recorded even when over or refused,
--          none a budget check on a budget (or the cold start's on a key
--          holding no count and no peek mark), else a read; 1 a charge of
--          zero; 2 a budget check that consumes its hits on a budget,
--          else a plain request; 3 a charge that is never a budget's:
--          recorded so, teaching nothing); 64 = pair: the check carries
--          a request id, whose pair key (the next of the pair keys) holds
--          "<admitted_ms>:<1 if its check flew, else 0>" while its stream
--          runs (limit.Check.PairID)); exact in a double, since
--          packed hits are below 2^32 (one argument fewer per key to
--          parse and convert)
-- then the big hits, in order (redisstore saturates hits at
--          limit.MaxHits, 2^51, over any limit).
-- Values: fixed "<window_end_us>:<count>", or with a budget's state
-- "<window_end_us>:<count>|<usage per check x 1024>/<charges>/<duration_ms>[/1];<first_ms>:<last_ms>:<n>;..."
-- (limit.State's Avg, Charges and DurMS, "/1" when Peek; the checks in
-- flight, oldest first, in buckets by admission time in Unix ms), sliding "<window_end_us>:<count>:<prev>",
-- token bucket "<tat_us>". A value that does not parse (a leaked or foreign
-- key, or a key of another type, which MGET reads as absent) counts as
-- absent and is rewritten or deleted here, so no key this script touches
-- is left without a TTL: every write is SET ... PX.
-- Returns, per key: over (0/1), remaining, us until reset; for every key
-- of a request a Redis command failed in (OOM, NOREPLICAS, ...): -1, the
-- error, 0 — the other requests are unaffected. (Redis refuses a key the
-- ACL denies before the script runs: redisstore then asks again per
-- request.)
--
-- Cost, measured (BenchmarkScript): on this project's machines every
-- redis.call costs about 1 us before the command's own work, and every
-- number turned into a string (tostring, string.format, a number argument)
-- about 0.7 us, so the script reads all keys with one MGET, works out what
-- depends only on the rule and the time (window end, value prefix, PX) once
-- per rule per call, and per key does one pattern match, the arithmetic,
-- and at most one SET or DEL.

-- now, GRACE, floor, format, idiv, px and fixedvalue: scripts/prelude.lua, sent in
-- front of this script.
-- The packed per-key argument (see the header and redisstore's
-- script.go): HITS_UNIT is 2^20, the place of the hits; below it the rule
-- (1-based) times RULE_UNIT, plus the flags.
local HITS_UNIT, RULE_UNIT, KIND_UNIT = 1048576, 128, 16
local FLAG_REFUND, FLAG_NO_VETO, FLAG_USAGE, FLAG_BIG, FLAG_PAIR = 1, 2, 4, 8, 64
-- A rule's third argument: algorithm + CALENDAR_UNIT * calendar +
-- FLIGHT_UNIT * the seconds a budget check stays in flight.
local CALENDAR_UNIT, FLIGHT_UNIT = 4, 16
-- The algorithms (limit.Algorithm).
local FIXED_WINDOW, SLIDING_WINDOW, TOKEN_BUCKET = 0, 1, 2
-- The usage kinds (limit.UsageKind) and the flags of a request that
-- costs its hits on a usage rule (usage, COST_CHECK), which the fast path
-- takes: a plain request on a key holding no budget's state.
local BY_HITS, ZERO_CHARGE, COST_CHECK, PLAIN_CHARGE = 0, 1, 2, 3
local COST_FLAGS = FLAG_USAGE + COST_CHECK * KIND_UNIT
-- A budget's learned horizon, as limit's: MIN_FLIGHT and COLD_FLIGHT ms,
-- SAMPLE_CHARGES, COLD_IN_FLIGHT and the buckets of a horizon; the
-- charges the usage per check follows (limit.AvgCharges).
local MIN_FLIGHT, COLD_FLIGHT, SAMPLE_CHARGES, COLD_IN_FLIGHT, BUCKETS = 250, 1000, 64, 4, 16
local AVG_CHARGES = 256
-- MAXC and MAXSC mirror limit.MaxCount and MaxSlidingCount (a charged
-- count saturates there), MAXDEBT limit's maxDebtUS (how far charges push
-- a bucket's arrival time).
local MAXC, MAXSC, MAXDEBT = 4503599627370496, 8589934592, 1125899906842624
local match, find, gmatch = string.match, string.find, string.gmatch
-- Invariants the code below relies on:
-- * Every window is a whole number of seconds (units are; multipliers are
--   whole), so w / 1000000 below is an exact integer.
-- * Every number is an integer below 2^53, exact in a double: times in us
--   (the rules bound windows to 100 years and a bucket's capacity to
--   2^52 us); limits below 2^51 (fixed windows) or 2^32 (the others),
--   hits at most 2^51, counts at most 2^52 (fixed; MAXC) or 2^33
--   (sliding, whose previous count is multiplied by up to 10^6: MAXSC).
-- * A request writes nothing until all its keys are read and decided, and
--   Redis refuses a script's writes (NOREPLICAS, OOM) on a condition that
--   cannot change while the script runs (OOM is checked at its first write
--   only, to keep scripts atomic): once one write of a request succeeded,
--   the rest do. So an error inside pcall comes at a request's first write,
--   before anything of it is written, and no request is left half-written.

-- days_from_civil and civil_from_days convert a UTC date to days since
-- the epoch and back (H. Hinnant's algorithms), for calendar periods; all
-- small non-negative integers here.
local function days_from_civil(y, m, d)
  if m <= 2 then y = y - 1 end
  local era = idiv(y, 400)
  local yoe = y - era * 400
  local mp = (m + 9) % 12
  local doy = idiv(153 * mp + 2, 5) + d - 1
  return era * 146097 + yoe * 365 + idiv(yoe, 4) - idiv(yoe, 100) + doy - 719468
end
local function civil_from_days(z)
  z = z + 719468
  local era = idiv(z, 146097)
  local doe = z - era * 146097
  local yoe = idiv(doe - idiv(doe, 1460) + idiv(doe, 36524) - idiv(doe, 146096), 365)
  local doy = doe - (365 * yoe + idiv(yoe, 4) - idiv(yoe, 100))
  local mp = idiv(5 * doy + 2, 153)
  local m = mp + 3
  if mp >= 10 then m = mp - 9 end
  local y = yoe + era * 400
  if m <= 2 then y = y + 1 end
  return y, m
end
-- calendar returns the start and end (us) of the UTC month (1) or year
-- (2) holding now: limit.Check.Window.
local DAY = 86400000000
local function calendar(cal)
  local y, m = civil_from_days(idiv(now, DAY))
  if cal == 2 then
    return days_from_civil(y, 1, 1) * DAY, days_from_civil(y + 1, 1, 1) * DAY
  end
  local ny, nm = y, m + 1
  if nm == 13 then ny, nm = y + 1, 1 end
  return days_from_civil(y, m, 1) * DAY, days_from_civil(ny, nm, 1) * DAY
end

-- Numbers concatenate as %.14g: exact only below 10^14.
local function num(x)
  if x < 1e14 then return x end
  return format('%d', x)
end

local R = tonumber(ARGV[2])
-- C, the per-request key counts sent: none when each request has one key.
local C = R
if R < 0 then R, C = -R, 0 end
local Q = tonumber(ARGV[3 + C])
-- Per rule: limit, window, algorithm, burst, and what follows from them
-- and now: window end and its value prefix and patterns, the sliding
-- window's weight of the previous window, the bucket's interval and
-- capacity, the PX of a fixed or sliding window's key.
local lim, win, alg, e, ws, pre, pat, ppat, ppm, ival, cap, ttl, fsec = {}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}
for q = 1, Q do
  local b = 4 + C + (q - 1) * 4
  local l, w, a, burst = tonumber(ARGV[b]), tonumber(ARGV[b + 1]), tonumber(ARGV[b + 2]), tonumber(ARGV[b + 3])
  local flight = floor(a / FLIGHT_UNIT)
  a = a - flight * FLIGHT_UNIT
  local cal = floor(a / CALENDAR_UNIT)
  a = a - cal * CALENDAR_UNIT
  lim[q], win[q], alg[q], fsec[q] = l, w, a, flight
  if a == TOKEN_BUCKET then
    if l > 0 then
      ival[q] = idiv(w + l - 1, l)
      if burst == 0 then burst = l end
      cap[q] = burst * ival[q]
    end
  else
    local we = now - (now - idiv(now, w) * w) + w
    ws[q] = we - w
    if cal > 0 then ws[q], we = calendar(cal) end
    e[q] = we
    pre[q] = format('%d:', we)
    if a == SLIDING_WINDOW then
      pat[q] = '^' .. pre[q] .. '(%d+):(%d+)$'
      ppat[q] = format('^%d:(%%d+):%%d+$', we - w)
      ppm[q] = idiv(we - now, w / 1000000)
      ttl[q] = px(we + w + GRACE)
    else
      pat[q] = '^' .. pre[q] .. '(%d+)$'
      ttl[q] = px(we + GRACE)
    end
  end
end
local P = tonumber(ARGV[4 + C + 4 * Q])
local A0 = 5 + C + 4 * Q -- the first key's values
local NK = #KEYS - P -- the counter keys; the pair keys follow
-- pidx[k]: the index in KEYS of counter key k's pair key.
local pidx = {}
if P > 0 then
  local j = NK
  for k = 1, NK do
    if tonumber(ARGV[A0 + k - 1]) % HITS_UNIT % RULE_UNIT >= FLAG_PAIR then
      j = j + 1
      pidx[k] = j
    end
  end
end

-- One MGET for the whole call (nothing is written yet if it fails).
-- unpack is bounded by Lua's stack: larger calls read key by key.
-- A key can come again in a later request of the call: what this call
-- wrote wins over what MGET read.
local vals, written = nil, {}
if #KEYS <= 1000 then vals = redis.call('MGET', unpack(KEYS)) end

local out = {}
-- Scratch per key i of the current request, reused across requests: its
-- rule, hits, flags, stored value, count, previous window's count,
-- whether it is over, its budget state (false, or a fixed window's
-- {avg, charges, duration, flights}: the common path carries one value
-- for it) and its usage role (role).
local key_rule, key_hits, key_flags, key_raw, key_count, key_prev, key_over, key_budget, key_role = {}, {}, {}, {}, {}, {}, {}, {}, {}
-- and, for a check carrying a request id on a fixed window's usage call,
-- its pair (pairread), else false.
local key_pair = {}

-- The time in ms, for a budget's flights.
local nowms = idiv(now, 1000)

-- horizon is limit.FlightMS: how long a budget check stays in flight
-- without a charge, from the learned stream duration dur (ms, 0 unknown):
-- twice it, or a quarter more where paired checks (pair) of a counter of
-- AVG_CHARGES charges (ak) learned it exactly.
local function horizon(q, dur, ak, pair)
  local d = COLD_FLIGHT
  if dur > 0 then
    d = math.max(2 * dur, MIN_FLIGHT)
    if pair and ak >= AVG_CHARGES then d = math.max(dur + idiv(dur, 4), MIN_FLIGHT) end
  end
  return math.min(d, fsec[q] * 1000)
end

local function inflight(fl)
  local n = 0
  if fl then for j = 3, #fl, 3 do n = n + fl[j] end end
  return n
end

-- parsebudget reads a fixed window's value with a budget's state: the
-- count (0 from another window), the usage per check, the charges, the
-- stream duration, the flights still unexpired (a flat list of first,
-- last, n) and the peek mark, or zeros for a value that does not parse.
local function parsebudget(raw, q, pair)
  local we, sc, state = fixedvalue(raw)
  local sav, sk, sd, rest
  if we then sav, sk, sd, rest = match(state, '^|(%d+)/(%d+)/?(%d*)(.*)$') end
  if not sav then return 0, 0, 0, 0, nil, false end
  local c, av, k, dur = 0, tonumber(sav), tonumber(sk), tonumber(sd) or 0
  local peek = find(rest, '^/1') ~= nil
  -- The usage per check, the duration and the peek mark serve the
  -- window after their own, no later.
  if we == e[q] then c = sc elseif we ~= ws[q] then av, k, dur, peek = 0, 0, 0, false end
  local d, fl = horizon(q, dur, k, pair), nil
  for f1, f2, n in gmatch(rest, ';(%d+):(%d+):(%d+)') do
    f2 = tonumber(f2)
    -- limit.expireFlights: from the oldest, while expired; a cold
    -- start that ran out without a charge was a peek.
    if fl or f2 + d >= nowms then
      if not fl then fl = {} end
      fl[#fl + 1] = tonumber(f1)
      fl[#fl + 1] = f2
      fl[#fl + 1] = tonumber(n)
    elseif k == 0 then
      peek = true
    end
  end
  return c, av, k, dur, fl, peek
end

-- role is limit's: what a usage call on a fixed window of count c does:
-- 0 a plain request (or a read), 1 a budget check, 2 a charge. A key is
-- a budget once a charge was recorded on it.
local function role(kind, h, c, bs, pms)
  -- A request admitted before: this is its stream end (limit.paired).
  if pms > 0 then return 2 end
  if kind == ZERO_CHARGE then return 2 end
  if kind == PLAIN_CHARGE then return 0 end
  local budget = bs and bs[2] > 0
  if kind == COST_CHECK then
    if budget then return 1 end
    return 0
  end
  if h > 0 then return 2 end
  if budget or c == 0 and not (bs and bs[5]) then return 1 end
  return 0
end

-- budgetover is limit.budgetOver: spent, the cost does not fit, or the
-- flights at the usage per check (a quarter of the limit before any
-- charge; the mean of k charges widened by (k+3)/(k+1)) leave nothing;
-- the check itself is not counted. Floats, in limit's order.
local function budgetover(q, h, c, bs)
  local l = lim[q]
  if c >= l or c + h > l then return true end
  if not bs then return false end
  local n = inflight(bs[4])
  if n == 0 then return false end
  if bs[2] == 0 then return c + n * (l * (1024 / COLD_IN_FLIGHT)) / 1024 >= l end
  local k = bs[2]
  return c + n * bs[1] * (k + 3) / (k + 1) / 1024 >= l
end

-- endflight ends one check of the flights fl's bucket at x (its first
-- field): the bucket goes with its last; nil when none is left.
local function endflight(fl, x)
  if fl[x + 2] > 1 then
    fl[x + 2] = fl[x + 2] - 1
    return fl
  end
  table.remove(fl, x)
  table.remove(fl, x)
  table.remove(fl, x)
  if #fl == 0 then return nil end
  return fl
end

-- budgetval returns a fixed window's value and PX with a budget's state
-- (bs, or none) after act: 1 a budget check admitted goes in flight
-- (limit.fly), 2 a charge of h lands (limit.land: learns the duration
-- while the oldest flight's age is trustworthy, ends the flight nearest
-- it; or, for a check carrying a request id (pair), limit.landPaired,
-- from its request's admission pms and whether its check flew; both
-- move the usage per check, the mean of the last 256 charges x 1024).
-- nil when nothing is left to keep.
local function budgetval(q, h, c, act, bs, pair, pms, pflew)
  local av, ak, dur, fl, peek = 0, 0, 0, nil, false
  if bs then av, ak, dur, fl, peek = bs[1], bs[2], bs[3], bs[4], bs[5] end
  if act == 1 then
    local g = math.max(idiv(horizon(q, dur, ak, pair), BUCKETS), 1)
    if not fl then fl = {} end
    local m = #fl
    if m > 0 and nowms - fl[m - 2] < g then
      fl[m - 1], fl[m] = nowms, fl[m] + 1
    else
      fl[m + 1], fl[m + 2], fl[m + 3] = nowms, nowms, 1
    end
  elseif act == 2 then
    if pair then
      -- limit.landPaired: the stream's exact duration; its own check's
      -- flight ended, if it flew and has not expired.
      if pms > 0 then
        dur = math.max(math.max(nowms - pms, 1), dur - idiv(dur, 32))
        if pflew and fl then
          for x = 1, #fl, 3 do
            if fl[x] <= pms and pms <= fl[x + 1] then
              fl = endflight(fl, x)
              break
            end
          end
        end
      end
    elseif fl then
      -- limit.firstWave: a first wave still running keeps teaching it,
      -- by 8/n of it at most a charge.
      local n = inflight(fl)
      local trusted = ak < SAMPLE_CHARGES or n <= 2
      if trusted or (ak < AVG_CHARGES and ak < n and n <= 4 * ak) then
        local age = math.max(nowms - fl[1], 1)
        if not trusted then age = math.min(age, dur + idiv(8 * dur, n)) end
        dur = math.max(age, dur - idiv(dur, 32))
      end
      local j = 1
      if dur > 0 then
        local target, best = 2 * (nowms - dur), -1
        for x = 1, #fl, 3 do
          local d = fl[x] + fl[x + 1] - target
          if d < 0 then d = -d end
          if best < 0 or d < best then j, best = x, d end
        end
      end
      fl = endflight(fl, j)
    elseif ak == 0 and c > h + 1 then
      -- limit.land: the first charge puts the requests admitted before
      -- it in flight.
      fl = {nowms, nowms, c - h - 1}
    end
    ak = math.min(ak + 1, AVG_CHARGES)
    local hh = h * 1024
    if hh >= av then av = av + idiv(hh - av, ak) else av = av - idiv(av - hh, ak) end
  end
  if ak == 0 and not fl and not peek then
    if c > 0 then return pre[q] .. num(c), ttl[q] end
    return nil, nil
  end
  local parts = {pre[q], num(c), '|', num(av), '/', ak, '/', dur}
  if peek then parts[#parts + 1] = '/1' end
  -- Flights never stretch the key past its window; the usage per check
  -- keeps it through the next.
  local xe = 0
  if c > 0 or fl then xe = e[q] + GRACE end
  if fl then
    for j = 1, #fl, 3 do
      parts[#parts + 1] = format(';%d:%d:%d', fl[j], fl[j + 1], fl[j + 2])
    end
  end
  -- As do the peek mark.
  if ak > 0 or peek then xe = math.max(xe, e[q] + win[q] + GRACE) end
  return table.concat(parts), px(xe)
end

-- retry is limit.retryUS: a budget check refused for its flights resets
-- when the oldest flight expires, or at the window's end if sooner.
local function retry(q, bs, pair)
  if not bs or not bs[4] then return e[q] - now end
  local at = (bs[4][2] + horizon(q, bs[3], bs[2], pair) + 1) * 1000
  return math.max(math.min(at, e[q]) - now, 0)
end

-- readkey returns KEYS[x]'s value: what this call wrote, else what the
-- call-wide MGET read, else its own MGET (like the call-wide read, a key
-- of another type reads as absent instead of failing the request); nil
-- when absent.
local function readkey(x)
  local raw
  if vals then
    raw = written[KEYS[x]]
    if raw == nil then raw = vals[x] end
  else
    raw = redis.call('MGET', KEYS[x])[1]
  end
  return raw or nil
end

-- writekey stores val in KEYS[x] for ex (PX), or deletes the key when val
-- is nil; raw is what it held (nothing is written when that is val).
local function writekey(x, val, ex, raw)
  local key = KEYS[x]
  if not val then
    if raw then
      redis.call('DEL', key)
      written[key] = false
    end
  elseif val ~= raw then
    redis.call('SET', key, val, 'PX', ex)
    written[key] = val
  end
end

-- pairread reads counter key k's pair (rule q): {when its request was
-- admitted (ms; 0 none, or admitted longer than the usage timeout ago:
-- limit.normalize), whether its check flew, the pair key's stored value}.
local function pairread(k, q)
  local raw = readkey(pidx[k])
  local sm, sf
  if raw then sm, sf = match(raw, '^(%d+):([01])$') end
  if sm and tonumber(sm) * 1000 + fsec[q] * 1000000 >= now then return {tonumber(sm), sf == '1', raw} end
  return {0, false, raw}
end

-- pairwrite keeps in counter key k's pair key that its request was
-- admitted now, and whether its check flew (flew); flew nil forgets it.
local function pairwrite(k, q, pr, flew)
  local v, ex = nil, nil
  if flew ~= nil then
    v = format('%d:0', nowms)
    if flew then v = format('%d:1', nowms) end
    ex = px(nowms * 1000 + fsec[q] * 1000000 + GRACE)
  end
  writekey(pidx[k], v, ex, pr[3])
end

-- decide decides the n keys from KEYS[k0+1], appending to out.
local function decide(k0, n)
  local admitted = true
  for i = 1, n do
    local k = k0 + i
    local v = tonumber(ARGV[A0 + k - 1])
    local h = floor(v / HITS_UNIT)
    local rf = v - h * HITS_UNIT
    local q, f = floor(rf / RULE_UNIT), rf % RULE_UNIT
    local pair = f >= FLAG_PAIR
    if pair then f = f - FLAG_PAIR end
    local kind = floor(f / KIND_UNIT)
    f = f - kind * KIND_UNIT
    if f >= FLAG_BIG then
      h, f = tonumber(ARGV[A0 + NK + h - 1]), f - FLAG_BIG
    end
    local refund, veto = f % 2 == FLAG_REFUND, f % 4 < FLAG_NO_VETO
    local usage = f >= FLAG_USAGE
    local budget = usage and h == 0 and kind == BY_HITS
    local raw = readkey(k)
    local a, c, p, o, bs, rl = alg[q], 0, 0, false, false, 0
    local pr = pair and usage and not refund and a == FIXED_WINDOW and pairread(k, q)
    local pms = 0
    if pr then pms = pr[1] end
    if a == FIXED_WINDOW then
      if raw then
        local sc = match(raw, pat[q])
        if sc then
          c = tonumber(sc)
        elseif find(raw, '|', 1, true) then
          local av, ak, dur, fl, peek
          c, av, ak, dur, fl, peek = parsebudget(raw, q, pair)
          bs = {av, ak, dur, fl, peek}
        end
      end
      if usage and not refund then rl = role(kind, h, c, bs, pms) end
      if rl == 1 then
        o = budgetover(q, h, c, bs)
      else
        o = not refund and c + h > lim[q]
      end
    elseif a == SLIDING_WINDOW then
      if raw then
        local sc, sp = match(raw, pat[q])
        if sc then
          c, p = tonumber(sc), tonumber(sp)
        else
          p = tonumber(match(raw, ppat[q]) or 0)
        end
      end
      if budget then
        o = c + idiv(p * ppm[q], 1000000) >= lim[q]
      else
        o = not refund and c + idiv(p * ppm[q], 1000000) + h > lim[q]
      end
    else
      c = now
      if raw and match(raw, '^%d+$') then
        local t = tonumber(raw)
        if t > now then c = t end
      end
      if budget then
        o = lim[q] == 0 or cap[q] - (c - now) < ival[q]
      elseif not refund then
        if lim[q] == 0 then
          o = h > 0
        else
          local room = cap[q] - (c - now)
          o = h > 0 and (room < 0 or h > idiv(room, ival[q]))
        end
      end
    end
    key_rule[i], key_hits[i], key_flags[i], key_raw[i], key_count[i], key_prev[i], key_over[i], key_budget[i], key_role[i] = q, h, f + kind * KIND_UNIT, raw, c, p, o, bs, rl
    key_pair[i] = pr
    if o and veto then admitted = false end
  end

  for i = 1, n do
    local k, q, h, f, raw, c, p, o, rl = k0 + i, key_rule[i], key_hits[i], key_flags[i], key_raw[i], key_count[i], key_prev[i], key_over[i], key_role[i]
    local kind = floor(f / KIND_UNIT)
    f = f - kind * KIND_UNIT
    local refund, usage = f % 2 == FLAG_REFUND, f % 8 >= FLAG_USAGE
    -- A usage charge is recorded whatever the decision (limit.Check.Charge).
    local charge = usage and (kind == ZERO_CHARGE or (kind == BY_HITS or kind == PLAIN_CHARGE) and h > 0)
    local pr = key_pair[i]
    local pair, pms, pflew = false, 0, false
    if pr then pair, pms, pflew = true, pr[1], pr[2] end
    -- A paired stream end is a charge too (limit.paired).
    local consume = (admitted and not o or charge or pms > 0) and not refund
    local a, l = alg[q], lim[q]
    local remaining, reset, val, ex = 0, 0, nil, nil
    if a == TOKEN_BUCKET then
      if l == 0 then
        reset = win[q]
      else
        local t, cp = ival[q], cap[q]
        if refund then
          if h >= idiv(c - now + t - 1, t) then c = now else c = c - h * t end
        elseif consume then
          if h > idiv(now + MAXDEBT - c, t) then
            c = math.max(c, now + MAXDEBT)
          else
            c = c + h * t
          end
        end
        local room = cp - (c - now)
        if room > 0 then remaining = idiv(room, t) end
        if remaining == 0 then reset = c + t - cp - now end
        if reset < 0 then reset = 0 end
        if c > now then
          val = format('%d', c)
          ex = px(c + GRACE)
        end
      end
    else
      if refund then
        c = c - h
        if c < 0 then c = 0 end
      elseif consume then
        c = c + h
        if c > MAXSC then
          if a == SLIDING_WINDOW then c = MAXSC elseif c > MAXC then c = MAXC end
        end
      end
      reset = e[q] - now
      ex = ttl[q]
      if a == SLIDING_WINDOW then
        local est = c + idiv(p * ppm[q], 1000000)
        if est < l then remaining = l - est end
        if c > 0 or p > 0 then val = pre[q] .. num(c) .. ':' .. num(p) end
      else
        if c < l then remaining = l - c end
        local bs = key_budget[i]
        if o and rl == 1 and key_count[i] < l and key_count[i] + h <= l then
          -- Refused for its flights, not a spent budget (limit.heldByFlights).
          reset = retry(q, bs, pair)
        end
        local act = 0
        if consume then act = rl end
        if bs or act > 0 then
          val, ex = budgetval(q, h, c, act, bs, pair, pms, pflew)
        elseif c > 0 then
          -- num(c), without the call on the common path
          if c < 1e14 then val = pre[q] .. c else val = pre[q] .. num(c) end
        end
      end
    end
    writekey(k, val, ex, raw)
    if pr then
      -- The request's first call admitted keeps when, for its stream
      -- end, which forgets it (limit.Decide).
      if consume and rl ~= 2 then
        pairwrite(k, q, pr, rl == 1)
      else
        pairwrite(k, q, pr, nil)
      end
    end
    local m = #out
    if o then out[m + 1] = 1 else out[m + 1] = 0 end
    out[m + 2] = remaining
    out[m + 3] = reset
  end
end

-- fast decides a request of the one key k on the common path — plain
-- hits (no refund, shadow, usage other than a request that costs its
-- hits, or big hits) on a fixed window whose key holds nothing or this
-- window's plain count, where such a request is plain — as decide does, operation
-- for operation, without its per-key scratch, flag decoding and pcall
-- (its one write is a redis.pcall); it returns false, having done
-- nothing, for anything else. Measured: 3.4 -> 2.95 us a key at batches
-- of 64, one key a request (docs/BENCHMARKS.md).
local function fast(k)
  if not vals then return false end
  local v = tonumber(ARGV[A0 + k - 1])
  local h = floor(v / HITS_UNIT)
  local rf = v - h * HITS_UNIT
  local fl = rf % RULE_UNIT
  if fl ~= 0 and fl ~= COST_FLAGS then return false end
  local q = (rf - fl) / RULE_UNIT
  if alg[q] ~= FIXED_WINDOW then return false end
  local key = KEYS[k]
  local raw = written[key]
  if raw == nil then raw = vals[k] end
  local c = 0
  if raw then
    local sc = match(raw, pat[q])
    if not sc then return false end
    c = tonumber(sc)
  else
    raw = nil
  end
  local l = lim[q]
  local o = c + h > l
  -- Under the limit, c + h <= l < 2^51: no saturation to apply.
  if not o then c = c + h end
  local val = nil
  if c > 0 then
    if c < 1e14 then val = pre[q] .. c else val = pre[q] .. num(c) end
  end
  local r = nil
  if not val then
    if raw then r = redis.pcall('DEL', key) end
  elseif val ~= raw then
    r = redis.pcall('SET', key, val, 'PX', ttl[q])
  end
  local m = #out
  if type(r) == 'table' and r.err then
    out[m + 1], out[m + 2], out[m + 3] = -1, tostring(r.err), 0
    return true
  end
  if r then written[key] = val or false end
  local remaining = 0
  if c < l then remaining = l - c end
  if o then out[m + 1] = 1 else out[m + 1] = 0 end
  out[m + 2] = remaining
  out[m + 3] = e[q] - now
  return true
end

local k0 = 0
for r = 1, R do
  local n = 1
  if C > 0 then n = tonumber(ARGV[2 + r]) end
  local mark = #out
  local ok, err = true, nil
  if n ~= 1 or not fast(k0 + 1) then ok, err = pcall(decide, k0, n) end
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
  k0 = k0 + n
end
return out
