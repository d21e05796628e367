-- grant.lua: takes or gives back the hits of leases (see internal/lease):
-- a grant takes up to n hits of a counter, never more than remain in the
-- window (fixed and sliding window) or than the bucket holds (token
-- bucket), and consumes them now, as a request's hits would be; so the
-- grants of a window add up to at most the limit. A give-back returns
-- unused hits, but only while the grant's window is current (a bucket
-- takes them back at any time, never past full). It mirrors limit.Grant
-- and limit.GiveBack operation for operation, in integers, and reads and
-- writes the values decide.lua does.
--
-- KEYS[i]  counter keys
-- ARGV[1]  "0": now from Redis TIME; otherwise now in us (tests only)
-- then per key 7 values: op (1 take, 2 give back), n, limit, window_us,
--          algorithm (0 fixed, 1 sliding, 2 token bucket), burst,
--          window end in us of the grant given back (0 for a take)
-- Returns per key: hits taken or given back, remaining after, us until
-- the window ends (for a bucket: until one more hit is allowed), and the
-- window's end in us on this clock (0 for a bucket), which a give-back
-- of those hits names.
-- The ops (TAKE, GIVE_BACK), the algorithms and GRACE:
-- scripts/contract.lua; now, floor, format, idiv, px and fixedvalue:
-- scripts/prelude.lua. Both are sent in front of this script.
local match = string.match

local out = {}
for i = 1, #KEYS do
  local b = 1 + (i - 1) * 7
  local op, n, l, w = tonumber(ARGV[b + 1]), tonumber(ARGV[b + 2]), tonumber(ARGV[b + 3]), tonumber(ARGV[b + 4])
  local a, burst, gend = tonumber(ARGV[b + 5]), tonumber(ARGV[b + 6]), tonumber(ARGV[b + 7])
  local raw = redis.call('MGET', KEYS[i])[1]
  local done, remaining, reset, val, ex, wend = 0, 0, 0, nil, nil, 0
  if a == TOKEN_BUCKET then
    if l > 0 then
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
    else
      reset = w
    end
  else
    local we = now - (now - idiv(now, w) * w) + w
    -- Times are formatted with %d: Lua turns large numbers into text
    -- with 14 significant digits.
    local pre = format('%d:', we)
    local c, p, suffix = 0, 0, ''

    if raw then
      if a == SLIDING_WINDOW then
        local sc, sp = match(raw, '^' .. pre .. '(%d+):(%d+)$')
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
    end
    local est = c
    if a == SLIDING_WINDOW then est = c + idiv(p * idiv(we - now, w / 1000000), 1000000) end
    if op == TAKE then
      if est < l then done = math.min(n, l - est) end
      c, est = c + done, est + done
    elseif op == GIVE_BACK and gend == we then
      done = math.min(n, c)
      c, est = c - done, est - done
    end
    if est < l then remaining = l - est end
    reset, wend = we - now, we
    if a == SLIDING_WINDOW then
      if c > 0 or p > 0 then val, ex = pre .. c .. ':' .. p, px(we + w + GRACE) end
    elseif suffix ~= '' then
      -- The key's TTL covers the budget's state; it must cover the count too.
      val, ex = pre .. c .. suffix, format('%d', math.max(redis.call('PTTL', KEYS[i]), math.ceil((we + GRACE - now) / 1000)))
    elseif c > 0 then
      val, ex = pre .. c, px(we + GRACE)
    end
  end
  if not val then
    if raw then redis.call('DEL', KEYS[i]) end
  elseif val ~= raw then
    redis.call('SET', KEYS[i], val, 'PX', ex)
  end
  out[#out + 1] = done
  out[#out + 1] = remaining
  out[#out + 1] = reset
  out[#out + 1] = wend
end
return out
