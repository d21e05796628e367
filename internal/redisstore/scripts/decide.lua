-- decide.lua: decides every fixed-window counter of one request, all or
-- nothing, in one atomic step on the Redis server.
--
-- KEYS[i]  counter keys (on Cluster: all of one hash slot)
-- ARGV[1]  "0": read now from Redis TIME (what production always sends);
--          otherwise now in integer microseconds (tests only)
-- then per key i, at ARGV[2+4(i-1)] ...:
--          limit, window_us, hits, flags (1 = refund, 2 = no veto: shadow)
-- A counter's value is "<window_end_us>:<count>". A value of another window,
-- or one that does not parse (a leaked or foreign key), counts as 0 and is
-- rewritten or deleted here, so no key touched by this script is left
-- without a TTL: every write is SET ... PX, value and expiry in one command.
-- Returns, per key: over (0/1), count after the decision, us until reset.
-- Cost: O(#KEYS); one GET per key, at most one SET or DEL per key.
local now
if ARGV[1] == '0' then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
else
  now = tonumber(ARGV[1])
end

local n = #KEYS
local counts, ends, over, stale, hitsOf, refund = {}, {}, {}, {}, {}, {}
local admitted = true
for i = 1, n do
  local b = 2 + (i - 1) * 4
  local lim, win, hits, flags = tonumber(ARGV[b]), tonumber(ARGV[b + 1]), tonumber(ARGV[b + 2]), tonumber(ARGV[b + 3])
  -- Integers below 2^53 are exact in Lua's doubles; guard the modulo anyway.
  local r = now % win
  if r < 0 then r = r + win elseif r >= win then r = r - win end
  local wend = now - r + win
  ends[i] = wend
  local c = 0
  local v = redis.call('GET', KEYS[i])
  if v then
    local e, cnt = string.match(v, '^(%d+):(%d+)$')
    if e and tonumber(e) == wend then
      c = tonumber(cnt)
    else
      stale[i] = true
    end
  end
  counts[i] = c
  hitsOf[i] = hits
  refund[i] = flags % 2 == 1
  over[i] = 0
  if not refund[i] and c + hits > lim then
    over[i] = 1
    if flags < 2 then admitted = false end
  end
end

local out = {}
for i = 1, n do
  local c, hits = counts[i], hitsOf[i]
  local nc = c
  if refund[i] then
    nc = c - hits
    if nc < 0 then nc = 0 end
  elseif admitted and over[i] == 0 then
    nc = c + hits
  end
  if nc ~= c or stale[i] then
    if nc > 0 then
      -- The expiry is housekeeping, not the window: the window end stored
      -- in the value decides, so a key read after its window counts 0
      -- whatever its TTL. One second of grace keeps a key from vanishing
      -- before its window ends on the clock that decides: Redis TIME, or
      -- a test's scripted clock, which runs faster than Redis's expiry.
      local ttl = math.ceil((ends[i] - now) / 1000) + 1000
      redis.call('SET', KEYS[i], string.format('%d:%d', ends[i], nc), 'PX', ttl)
    else
      redis.call('DEL', KEYS[i])
    end
  end
  out[#out + 1] = over[i]
  out[#out + 1] = nc
  out[#out + 1] = ends[i] - now
end
return out
