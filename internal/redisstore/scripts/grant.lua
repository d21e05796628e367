-- grant.lua: takes or gives back the hits of leases (see internal/lease)
-- and of global grants (internal/global), and settles the usage charged
-- beyond what a grant held: a grant takes up to n hits of a counter,
-- never more than remain in the window (fixed and sliding window) or than
-- the bucket holds (token bucket), and consumes them now, as a request's
-- hits would be; so the grants of a window add up to at most the limit. A
-- give-back returns unused hits, but only while the grant's window is
-- current (a bucket takes them back at any time, never past full). A
-- settle adds n to a fixed window's count whatever it is (a usage charge
-- is recorded), once, unless it names a window ended before the last
-- (0: unknown): the settle marks key keeps, per settler, the highest seq
-- counted.
-- It mirrors limit.Grant, limit.GiveBack and limit.Settle operation for
-- operation, in integers, and reads and writes the values decide.lua
-- does.
--
-- KEYS     per op its counter key; a settle's is followed by its marks key
-- ARGV[1]  "0": now from Redis TIME; otherwise now in us (tests only)
-- then per op GRANT_ARGS values: op (TAKE, GIVE_BACK, SETTLE), n, limit,
--          window_us, algorithm, burst, window end in us (of the grant
--          given back; of the settle's window, 0 if unknown; 0
--          for a take), settler, seq (a settle's; '' and 0 otherwise)
-- Returns per op: hits taken, given back or settled (a settle already
-- counted reports its n again), remaining after, us until the window
-- ends (for a bucket: until one more hit is allowed), and the window's
-- end in us on this clock (0 for a bucket), which a give-back of those
-- hits names.
-- The ops, the algorithms, MAXC and GRACE: scripts/contract.lua; now,
-- floor, format, idiv, px and fixedvalue: scripts/prelude.lua. Both are
-- sent in front of this script.
local match = string.match

-- bucket takes or gives back n tokens of a token bucket; it returns the
-- op's done, remaining and reset, and the value and PX to store (nil: the
-- key goes).
local function bucket(op, n, l, w, burst, raw)
  if l == 0 then return 0, 0, w end
  local done, remaining, reset, val, ex = 0, 0, 0, nil, nil
  local t = idiv(w + l - 1, l)
  if burst == 0 then burst = l end
  local cap = burst * t
  local tat = now
  if raw and match(raw, '^%d+$') then
    local v = tonumber(raw)
    if v > now then tat = v end
  end
  if op == TAKE then
    local room = cap - (tat - now)
    if room > 0 then done = math.min(n, idiv(room, t)) end
    tat = tat + done * t
  else
    tat = math.max(now, tat - n * t)
    done = n
  end
  local room = cap - (tat - now)
  if room > 0 then remaining = idiv(room, t) end
  if remaining == 0 then reset = math.max(0, tat + t - cap - now) end
  if tat > now then val, ex = format('%d', tat), px(tat + GRACE) end
  return done, remaining, reset, val, ex
end

-- windowed reads a fixed or sliding window's value: the window's end,
-- its count, the previous window's count (sliding) and a budget's state.
local function windowed(a, w, raw)
  local we = now - (now - idiv(now, w) * w) + w
  local c, p, suffix = 0, 0, ''
  if not raw then return we, c, p, suffix end
  if a == SLIDING_WINDOW then
    -- Times are formatted with %d: Lua turns large numbers into text
    -- with 14 significant digits.
    local sc, sp = match(raw, '^' .. format('%d:', we) .. '(%d+):(%d+)$')
    if sc then
      c, p = tonumber(sc), tonumber(sp)
    else
      p = tonumber(match(raw, format('^%d:(%%d+):%%d+$', we - w)) or 0)
    end
  else
    -- A budget's state follows the count and is kept, from another
    -- window too (prelude.lua's fixedvalue).
    local vwe, vc, state = fixedvalue(raw)
    if vwe == we then
      c, suffix = vc, state
    elseif vwe then
      suffix = state
    end
  end
  return we, c, p, suffix
end

-- settled says whether settler's seq was counted in the window ending at
-- we, and marks it counted.
local function settled(mkey, settler, seq, we, w)
  local last = tonumber(redis.call('HGET', mkey, settler) or '0')
  if seq <= last then return true end
  redis.call('HSET', mkey, settler, format('%d', seq))
  -- Kept a window past this one: a settle naming no window (0) that
  -- lands late is still known.
  redis.call('PEXPIREAT', mkey, math.ceil((we + w + GRACE) / 1000))
  return false
end

local out = {}
local k = 1
for i = 1, (#ARGV - 1) / GRANT_ARGS do
  local b = 1 + (i - 1) * GRANT_ARGS
  local op, n, l, w = tonumber(ARGV[b + 1]), tonumber(ARGV[b + 2]), tonumber(ARGV[b + 3]), tonumber(ARGV[b + 4])
  local a, burst, gend = tonumber(ARGV[b + 5]), tonumber(ARGV[b + 6]), tonumber(ARGV[b + 7])
  local key = KEYS[k]
  local raw = redis.call('MGET', key)[1]
  local done, remaining, reset, val, ex, wend = 0, 0, 0, nil, nil, 0
  if a == TOKEN_BUCKET then
    done, remaining, reset, val, ex = bucket(op, n, l, w, burst, raw)
  else
    local we, c, p, suffix = windowed(a, w, raw)
    local est = c
    if a == SLIDING_WINDOW then est = c + idiv(p * idiv(we - now, w / 1000000), 1000000) end
    if op == TAKE then
      if est < l then done = math.min(n, l - est) end
      c, est = c + done, est + done
    elseif op == GIVE_BACK and gend == we then
      done = math.min(n, c)
      c, est = c - done, est - done
    elseif op == SETTLE and (gend == 0 or gend >= we - w) then
      done = n
      if not settled(KEYS[k + 1], ARGV[b + 8], tonumber(ARGV[b + 9]), we, w) then
        c = math.min(c + n, MAXC)
        est = c
      end
    end
    if est < l then remaining = l - est end
    reset, wend = we - now, we
    if a == SLIDING_WINDOW then
      if c > 0 or p > 0 then val, ex = format('%d:', we) .. c .. ':' .. p, px(we + w + GRACE) end
    elseif suffix ~= '' then
      -- The key's TTL covers the budget's state; it must cover the count too.
      val, ex = format('%d:', we) .. c .. suffix, format('%d', math.max(redis.call('PTTL', key), math.ceil((we + GRACE - now) / 1000)))
    elseif c > 0 then
      val, ex = format('%d:', we) .. c, px(we + GRACE)
    end
  end
  if op == SETTLE then k = k + 2 else k = k + 1 end
  if not val then
    if raw then redis.call('DEL', key) end
  elseif val ~= raw then
    redis.call('SET', key, val, 'PX', ex)
  end
  out[#out + 1] = done
  out[#out + 1] = remaining
  out[#out + 1] = reset
  out[#out + 1] = wend
end
return out
