-- seed.lua: starts ratelimitd's fixed-window counters from
-- envoyproxy/ratelimit's counts (--carry-incumbent-counts), once a
-- counter a window, before decide.lua first writes it.
--
-- KEYS[i]   a counter key of ratelimitd's
-- ARGV[1]   "0": now from Redis TIME; otherwise now in us (tests only)
-- ARGV[1+i] the window in us of KEYS[i], then ARGV[1+n+i] the
--           incumbent's key of that counter without its window start
--           (<CACHE_KEY_PREFIX><domain>_<k1>_<v1>_..._), to which the
--           epoch-aligned window start in seconds is appended, as the
--           incumbent writes it.
-- For each key: a state of this window already there (this or another
-- instance has written it) is left alone; otherwise a numeric incumbent
-- count c of this window becomes the count: "<end>:<c>", the rest of a
-- budget's state of the window before kept (its usage per check and
-- flights, which decide.lua carries over windows), PX as decide.lua's.
-- The incumbent's key is only read; on Cluster it lives in another
-- slot, so redisstore refuses this there.
-- Returns per key: 0 left alone, 1 carried, 2 no incumbent count, 3 an
-- incumbent key that is not a count (ignored).
-- now, GRACE, idiv, px and fixedvalue: scripts/prelude.lua, sent in front.
local n = #KEYS
local out = {}
for i = 1, n do
  local w = tonumber(ARGV[1 + i])
  local e = idiv(now, w) * w + w
  local raw = redis.call('GET', KEYS[i])
  local we, rest
  if type(raw) == 'string' then
    local _
    we, _, rest = fixedvalue(raw)
  end
  if we == e then
    out[i] = 0
  else
    -- pcall: a key of another type (WRONGTYPE) is not a count, and
    -- must not stop the others.
    local ok, v = pcall(redis.call, 'GET', ARGV[1 + n + i] .. format('%d', (e - w) / 1000000))
    if not ok then v = '' end
    local c = v and tonumber(v)
    if not v then
      out[i] = 2
    elseif not c or c < 0 or c ~= floor(c) or c >= 4503599627370496 then
      out[i] = 3
    else
      local xe = e + GRACE
      -- A budget's state serves the window after its own only.
      if rest and rest ~= '' and we == e - w then
        xe = e + w + GRACE
      else
        rest = ''
      end
      redis.call('SET', KEYS[i], format('%d:%d', e, c) .. rest, 'PX', px(xe))
      out[i] = 1
    end
  end
end
return out
