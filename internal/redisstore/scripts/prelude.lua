-- prelude.lua: what every script of this package shares; redisstore sends
-- it in front of each, after contract.lua (a script cannot include
-- another).
-- ARGV[1]  "0": now from Redis TIME (what production always sends);
--          otherwise now in integer microseconds (tests only)
local now
if ARGV[1] == '0' then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
else
  now = tonumber(ARGV[1])
end
local floor, format = math.floor, string.format
-- Exact floor division of non-negative integers below 2^53: a double
-- quotient can round up across an integer.
local function idiv(a, b)
  local q = floor(a / b)
  if q * b > a then q = q - 1 elseif (q + 1) * b <= a then q = q + 1 end
  return q
end
-- PX argument for an absolute expiry in us.
local function px(expire) return format('%d', math.ceil((expire - now) / 1000)) end
-- fixedvalue splits a fixed window's value, "<window_end_us>:<count>"
-- and, on a budget, its state "|<usage per check>/<charges>/..."
-- (decide.lua reads and writes it; grant.lua keeps it): the window end,
-- the count and the state's text ('' for none); nil for a value that
-- does not parse.
local function fixedvalue(raw)
  local we, c, state = string.match(raw, '^(%d+):(%d+)(.*)$')
  if not we or (state ~= '' and string.sub(state, 1, 1) ~= '|') then return nil end
  return tonumber(we), tonumber(c), state
end
