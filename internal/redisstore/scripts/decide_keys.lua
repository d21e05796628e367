-- decide_keys.lua: each request's keys read, judged all or nothing and
-- written, and the call's loop over its requests. Sent after decide.lua
-- and decide_budget.lua.

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

-- keyarg decodes counter key k's argument: its rule, hits (big hits
-- read from their place), flags (without FLAG_BIG and FLAG_PAIR), usage
-- kind and whether it carries a request id.
local function keyarg(k)
  local v = tonumber(ARGV[A0 + k - 1])
  local h = floor(v / HITS_UNIT)
  local rf = v - h * HITS_UNIT
  local q, f = floor(rf / RULE_UNIT), rf % RULE_UNIT
  if f >= FLAG_MARK then f = f - FLAG_MARK end
  local pair = f >= FLAG_PAIR
  if pair then f = f - FLAG_PAIR end
  local kind = floor(f / KIND_UNIT)
  f = f - kind * KIND_UNIT
  if f >= FLAG_BIG then
    h, f = tonumber(ARGV[A0 + NK + h - 1]), f - FLAG_BIG
  end
  return q, h, f, kind, pair
end

-- fixedval is a fixed window's plain value for count c, nil for none
-- (num(c), without the call on the common path).
local function fixedval(q, c)
  if c == 0 then return nil end
  if c < 1e14 then return pre[q] .. c end
  return pre[q] .. num(c)
end

-- readfixed reads a fixed window's count and budget state (false for
-- none) from raw; a value of another window counts 0.
local function readfixed(q, raw, pair)
  if not raw then return 0, false end
  local sc = match(raw, pat[q])
  if sc then return tonumber(sc), false end
  if not find(raw, '|', 1, true) then return 0, false end
  local c, av, ak, dur, fl, peek, costed, ended = parsebudget(raw, q, pair)
  return c, {av, ak, dur, fl, peek, costed, ended}
end

-- readsliding reads a sliding window's count and previous count.
local function readsliding(q, raw)
  if not raw then return 0, 0 end
  local sc, sp = match(raw, pat[q])
  if sc then return tonumber(sc), tonumber(sp) end
  return 0, tonumber(match(raw, ppat[q]) or 0)
end

-- oversliding: h hits (none: a budget check, over once spent) do not fit.
local function oversliding(q, h, c, p, refund, budget)
  local est = c + idiv(p * ppm[q], 1000000)
  if budget then return est >= lim[q] end
  return not refund and est + h > lim[q]
end

-- readbucket reads a token bucket's arrival time, now when absent or past.
local function readbucket(raw)
  if raw and match(raw, '^%d+$') then
    local t = tonumber(raw)
    if t > now then return t end
  end
  return now
end

-- overbucket: h hits do not fit in the bucket of arrival time c (a
-- budget check: not one more).
local function overbucket(q, h, c, refund, budget)
  local l = lim[q]
  if budget then return l == 0 or cap[q] - (c - now) < ival[q] end
  if refund then return false end
  if l == 0 then return h > 0 end
  local room = cap[q] - (c - now)
  return h > 0 and (room < 0 or h > idiv(room, ival[q]))
end

-- Scratch per key i of the current request, reused across requests: its
-- rule, hits, flags, stored value, count, previous window's count,
-- whether it is over, its budget state (false, or a fixed window's
-- {avg, charges, duration, flights, peek}), its usage role and, for a
-- check carrying a request id on a fixed window's usage call, its pair
-- (pairread), else false.
local key_rule, key_hits, key_flags, key_raw, key_count, key_prev, key_over, key_budget, key_role = {}, {}, {}, {}, {}, {}, {}, {}, {}
local key_pair = {}

-- judge reads and decides counter key k, the request's i-th, into the
-- scratch; true when it is over and may refuse the request.
local function judge(i, k)
  local q, h, f, kind, pair = keyarg(k)
  local refund, veto, usage = f % 2 == FLAG_REFUND, f % 4 < FLAG_NO_VETO, f >= FLAG_USAGE
  local budget = usage and h == 0 and kind == BY_HITS
  local raw = readkey(k)
  local a, c, p, o, bs, rl = alg[q], 0, 0, false, false, 0
  local pr = pair and usage and not refund and a == FIXED_WINDOW and pairread(k, q)
  if a == FIXED_WINDOW then
    c, bs = readfixed(q, raw, pair)
    if usage and not refund then rl = role(kind, h, c, bs, pr and pr[1] or 0) end
    if rl == 1 then o = budgetover(q, h, c, bs) else o = not refund and c + h > lim[q] end
  elseif a == SLIDING_WINDOW then
    c, p = readsliding(q, raw)
    o = oversliding(q, h, c, p, refund, budget)
  else
    c = readbucket(raw)
    o = overbucket(q, h, c, refund, budget)
  end
  key_rule[i], key_hits[i], key_flags[i], key_raw[i], key_count[i], key_prev[i], key_over[i], key_budget[i], key_role[i] = q, h, f + kind * KIND_UNIT, raw, c, p, o, bs, rl
  key_pair[i] = pr
  return o and veto
end

-- applybucket is a token bucket after h hits (refunded, consumed or
-- neither) on arrival time c: remaining, reset, value and PX.
local function applybucket(q, h, c, refund, consume)
  if lim[q] == 0 then return 0, win[q], nil, nil end
  local t, cp = ival[q], cap[q]
  if refund then
    if h >= idiv(c - now + t - 1, t) then c = now else c = c - h * t end
  elseif consume then
    if h > idiv(now + MAXDEBT - c, t) then c = math.max(c, now + MAXDEBT) else c = c + h * t end
  end
  local room, remaining, reset = cp - (c - now), 0, 0
  if room > 0 then remaining = idiv(room, t) end
  if remaining == 0 then reset = math.max(c + t - cp - now, 0) end
  if c > now then return remaining, reset, format('%d', c), px(c + GRACE) end
  return remaining, reset, nil, nil
end

-- count is a window's count c after h hits: refunded (never below 0) or
-- consumed (saturating at MAXC, MAXSC for a sliding window).
local function count(a, c, h, refund, consume)
  if refund then return math.max(c - h, 0) end
  if not consume then return c end
  c = c + h
  if c > MAXSC then
    if a == SLIDING_WINDOW then c = MAXSC elseif c > MAXC then c = MAXC end
  end
  return c
end

-- applysliding is a sliding window of count c (after the hits) and
-- previous count p: remaining, reset, value and PX.
local function applysliding(q, c, p)
  local est, remaining, val = c + idiv(p * ppm[q], 1000000), 0, nil
  if est < lim[q] then remaining = lim[q] - est end
  if c > 0 or p > 0 then val = pre[q] .. num(c) .. ':' .. num(p) end
  return remaining, e[q] - now, val, ttl[q]
end

-- applyfixed is the request's i-th key, a fixed window of count c after
-- its hits h, whose usage role rl acted when consumed (a budget check
-- given back, unfly, leaves its flight; a call of kind stating 0 read
-- before any charge counts a stream's end): remaining, reset, value and
-- PX.
local function applyfixed(i, q, h, c, consume, pair, pms, pflew, unfly, kind)
  local l, bs, rl, before = lim[q], key_budget[i], key_role[i], key_count[i]
  local remaining, reset = 0, e[q] - now
  if c < l then remaining = l - c end
  if key_over[i] and rl == 1 and before < l and before + h <= l then
    -- Refused for its flights, not a spent budget (limit.heldByFlights).
    reset = retry(q, bs, pair)
  end
  local act = 0
  if consume then act = rl elseif unfly then act = 3 end
  if consume and rl == 0 and kind == BY_HITS and h == 0 and c > 0 and not (bs and bs[2] > 0) then
    act = 4 -- limit.readsEnd
  end
  if bs or act > 0 then
    local val, ex = budgetval(q, h, c, act, bs, pair, pms, pflew, kind == COST_CHECK)
    return remaining, reset, val, ex
  end
  return remaining, reset, fixedval(q, c), ttl[q]
end

-- marked reports that counter key k carries a mark whose bit is set: a
-- charge recorded before and sent again, answered, not recorded again.
local function marked(k)
  return midx[k] ~= nil and redis.call('GETBIT', KEYS[midx[k]], moff[k]) == 1
end

-- store writes the request's i-th key, counter key k of rule q: its
-- value; its mark, set once the charge is written and kept until a
-- charge of the window can no longer be sent again (the journal drops it
-- at the window's end); and its pair: the request's first call admitted
-- keeps when, for its stream end, which forgets it (limit.Decide).
local function store(i, k, q, val, ex, consume)
  writekey(k, val, ex, key_raw[i])
  local mk, pr, rl = midx[k], key_pair[i], key_role[i]
  if mk then
    redis.call('SETBIT', KEYS[mk], moff[k], 1)
    redis.call('PEXPIRE', KEYS[mk], px(now + win[q] + GRACE))
  end
  if pr then
    local flew = nil
    if consume and rl ~= 2 then flew = rl == 1 end
    pairwrite(k, q, pr, flew)
  end
end

-- settle applies the request's i-th key, counter key k, as the request
-- was admitted or not, writes it and appends its answer to out.
local function settle(i, k, admitted)
  local q, h, f, c, o, rl, pr = key_rule[i], key_hits[i], key_flags[i], key_count[i], key_over[i], key_role[i], key_pair[i]
  local kind = floor(f / KIND_UNIT)
  f = f - kind * KIND_UNIT
  local refund, usage = f % 2 == FLAG_REFUND, f % 8 >= FLAG_USAGE
  -- A usage charge is recorded whatever the decision (limit.Check.Charge).
  local charge = usage and (kind == ZERO_CHARGE or (kind == BY_HITS or kind == PLAIN_CHARGE) and h > 0)
  local pair, pms, pflew = false, 0, false
  if pr then pair, pms, pflew = true, pr[1], pr[2] end
  local dup = marked(k)
  -- A paired stream end is a charge too (limit.paired).
  -- So is a stream end on a costed budget (limit.endsStream).
  local consume = (admitted and not o or charge or pms > 0 or rl == 2) and not refund and not dup
  local a, remaining, reset, val, ex = alg[q], 0, 0, nil, nil
  if a == TOKEN_BUCKET then
    remaining, reset, val, ex = applybucket(q, h, c, refund, consume)
  elseif a == SLIDING_WINDOW then
    remaining, reset, val, ex = applysliding(q, count(a, c, h, refund, consume), key_prev[i])
  else
    -- A budget check given back leaves its flight (limit.givesBackFlight).
    local bs, zero = key_budget[i], kind == BY_HITS and h == 0
    local unfly = refund and usage and bs and bs[4] and (bs[2] > 0 and (kind == COST_CHECK or zero and not bs[6]) or bs[2] == 0 and zero and c == 0)
    remaining, reset, val, ex = applyfixed(i, q, h, count(a, c, h, refund, consume), consume, pair, pms, pflew, unfly, usage and not refund and kind)
  end
  if not dup then store(i, k, q, val, ex, consume) end
  local m = #out
  if o then out[m + 1] = 1 else out[m + 1] = 0 end
  out[m + 2], out[m + 3] = remaining, reset
end

-- decide decides the n keys from KEYS[k0+1], all or nothing, appending
-- to out: every key is read and judged before any is written.
local function decide(k0, n)
  local admitted = true
  for i = 1, n do
    if judge(i, k0 + i) then admitted = false end
  end
  for i = 1, n do settle(i, k0 + i, admitted) end
end

-- fast decides a request of the one key k on the common path — plain
-- hits (no refund, shadow, usage other than a request that costs its
-- hits, or big hits) on a fixed window whose key holds nothing or this
-- window's plain count, where such a request is plain — as decide does,
-- operation for operation, without its per-key scratch, flag decoding
-- and pcall (its one write is a redis.pcall); it returns false, having
-- done nothing, for anything else.
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
  local raw, c = written[key], 0
  if raw == nil then raw = vals[k] end
  if raw then
    local sc = match(raw, pat[q])
    if not sc then return false end
    c = tonumber(sc)
  else
    raw = nil
  end
  -- Under the limit, c + h <= l < 2^51: no saturation to apply.
  local l, o = lim[q], c + h > lim[q]
  if not o then c = c + h end
  local val, r = fixedval(q, c), nil
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
  out[m + 1], out[m + 2], out[m + 3] = o and 1 or 0, math.max(l - c, 0), e[q] - now
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
