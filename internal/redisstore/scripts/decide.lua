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
-- then Q, the number of distinct rules, and per rule RULE_ARGS values:
--          limit, window_us, algorithm + CALENDAR_UNIT * calendar (0 none,
--          1 the UTC month, 2 the UTC year: a fixed window's period) +
--          FLIGHT_UNIT * the longest a budget check stays in flight, in
--          seconds (limit.Check.FlightS), burst
-- then P, the number of pair keys (KEYS after the counter keys: of each
--          check that carries a request id, in order), M, the number of
--          marks keys (KEYS after the pair keys: of each charge that
--          carries a mark, in order), and M offsets, each mark's bit in
--          its marks key: a marked charge is recorded only if its bit is
--          not set, and sets it (limit.Check.MarkKey)
-- then per counter key, in order, 1 value: hits * HITS_UNIT + rule *
--          RULE_UNIT + flags (scripts/contract.lua names each flag, and
--          KIND_UNIT * the usage kind: BY_HITS, some hits a charge,
--          recorded even when over or refused, none a budget check on a
--          budget (or the cold start's on a key holding no count and no
--          peek mark), else a read; ZERO_CHARGE; COST_CHECK, a budget
--          check that consumes its hits on a budget, else a plain
--          request; PLAIN_CHARGE, a charge that is never a budget's,
--          teaching nothing). A paired check's pair key holds
--          "<admitted_ms>:<1 if its check flew, else 0>" while its stream
--          runs (limit.Check.PairID). Packed hits are below 2^32, so the
--          value is exact in a double (one argument fewer per key)
-- then the big hits (FLAG_BIG), in order (redisstore saturates hits at
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

-- The numbers shared with Go (HITS_UNIT, the flags, the algorithms, the
-- usage kinds, a budget's horizon, the saturations, GRACE):
-- scripts/contract.lua; now, floor, format, idiv, px and fixedvalue:
-- scripts/prelude.lua. Both are sent in front of this script.
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
-- windowrule sets rule q's window (algorithm a, calendar cal) from now.
local function windowrule(q, w, a, cal)
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
for q = 1, Q do
  local b = 4 + C + (q - 1) * RULE_ARGS
  local l, w, a, burst = tonumber(ARGV[b]), tonumber(ARGV[b + 1]), tonumber(ARGV[b + 2]), tonumber(ARGV[b + 3])
  local flight = floor(a / FLIGHT_UNIT)
  a = a - flight * FLIGHT_UNIT
  local cal = floor(a / CALENDAR_UNIT)
  a = a - cal * CALENDAR_UNIT
  lim[q], win[q], alg[q], fsec[q] = l, w, a, flight
  if a ~= TOKEN_BUCKET then
    windowrule(q, w, a, cal)
  elseif l > 0 then
    ival[q] = idiv(w + l - 1, l)
    if burst == 0 then burst = l end
    cap[q] = burst * ival[q]
  end
end
local P, M = tonumber(ARGV[4 + C + RULE_ARGS * Q]), tonumber(ARGV[5 + C + RULE_ARGS * Q])
local A0 = 6 + C + RULE_ARGS * Q + M -- the first key's values
local NK = #KEYS - P - M -- the counter keys; the pair keys and marks keys follow
-- pidx[k]: the index in KEYS of counter key k's pair key; midx[k], of its
-- marks key, and moff[k] its bit there.
local pidx, midx, moff = {}, {}, {}
if P + M > 0 then
  local j, m = NK, 0
  for k = 1, NK do
    local f = tonumber(ARGV[A0 + k - 1]) % HITS_UNIT % RULE_UNIT
    if f >= FLAG_MARK then
      m, f = m + 1, f - FLAG_MARK
      midx[k], moff[k] = NK + P + m, tonumber(ARGV[A0 - M + m - 1])
    end
    if f >= FLAG_PAIR then
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

-- The time in ms, for a budget's flights.
local nowms = idiv(now, 1000)
