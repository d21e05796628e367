-- decide_budget.lua: a token budget's state in a fixed window's value
-- (limit's budget.go, operation for operation): its flights, learned
-- duration and usage per check. Sent after decide.lua (whose per-rule
-- tables and nowms it reads) and before decide_keys.lua.

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

-- parsebudget reads a fixed window's value with a budget's state
-- (|avg/charges/duration[/marks[/ended]], marks 1 peek + 2 costed): the
-- count (0 from another window), the usage per check, the charges, the
-- stream duration, the flights still unexpired (a flat list of first,
-- last, n), the peek and costed marks and the stream ends read before a
-- charge (limit.State.Ended), or zeros for a value that does not parse.
local function parsebudget(raw, q, pair)
  local we, sc, state = fixedvalue(raw)
  local sav, sk, sd, rest
  if we then sav, sk, sd, rest = match(state, '^|(%d+)/(%d+)/?(%d*)(.*)$') end
  if not sav then return 0, 0, 0, 0, nil, false, false, 0 end
  local c, av, k, dur = 0, tonumber(sav), tonumber(sk), tonumber(sd) or 0
  local sm, sx = match(rest, '^/(%d+)/?(%d*)')
  local marks, ended = tonumber(sm) or 0, tonumber(sx) or 0
  local peek, costed = marks % 2 == 1, marks % 4 >= 2
  -- The usage per check, the duration and the marks serve the window
  -- after their own, no later; the ends read, their own only.
  if we == e[q] then c = sc else ended = 0 end
  if we ~= e[q] and we ~= ws[q] then av, k, dur, peek, costed = 0, 0, 0, false, false end
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
  return c, av, k, dur, fl, peek, costed, ended
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
  -- A budget whose requests cost 1: a 0 is their stream's end.
  if budget and bs[6] then return 2 end
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

-- fly puts a budget check admitted now in flight (limit.fly): in the
-- newest bucket of the flights fl while it is younger than a bucket's
-- share of the horizon, else in a new one.
local function fly(q, fl, dur, ak, pair)
  local g = math.max(idiv(horizon(q, dur, ak, pair), BUCKETS), 1)
  if not fl then fl = {} end
  local m = #fl
  if m > 0 and nowms - fl[m - 2] < g then
    fl[m - 1], fl[m] = nowms, fl[m] + 1
  else
    fl[m + 1], fl[m + 2], fl[m + 3] = nowms, nowms, 1
  end
  return fl
end

-- landpaired is limit.landPaired: the stream's exact duration, from its
-- request's admission pms; its own check's flight ended, if it flew
-- (pflew) and has not expired.
local function landpaired(fl, dur, pms, pflew)
  if pms == 0 then return fl, dur end
  dur = math.max(math.max(nowms - pms, 1), dur - idiv(dur, 32))
  if pflew and fl then
    for x = 1, #fl, 3 do
      if fl[x] <= pms and pms <= fl[x + 1] then return endflight(fl, x), dur end
    end
  end
  return fl, dur
end

-- landflights is limit.land on flights: learns the duration while the
-- oldest flight's age is trustworthy (limit.firstWave: a first wave still
-- running keeps teaching it, by 8/n of it at most a charge), and ends the
-- flight nearest it.
local function landflights(fl, dur, ak)
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
  return endflight(fl, j), dur
end

-- land lands a charge of h on count c (limit.land): ends a flight (the
-- paired check's own, else the one nearest the learned duration), or,
-- the first charge, puts the requests admitted before it in flight; and
-- moves the usage per check, the mean of the last AVG_CHARGES charges
-- x 1024.
local function land(h, c, av, ak, dur, fl, pair, pms, pflew, ended)
  if pair then
    fl, dur = landpaired(fl, dur, pms, pflew)
  elseif fl then
    fl, dur = landflights(fl, dur, ak)
  elseif ak == 0 and c > h + 1 + ended then
    fl = {nowms, nowms, c - h - 1 - ended}
  end
  ak = math.min(ak + 1, AVG_CHARGES)
  local hh = h * 1024
  if hh >= av then av = av + idiv(hh - av, ak) else av = av - idiv(av - hh, ak) end
  return av, ak, dur, fl
end

-- budgetstate renders a fixed window's value of count c with a budget's
-- state, and its PX; nil when nothing is left to keep.
local function budgetstate(q, c, av, ak, dur, fl, peek, costed, ended)
  if ak == 0 and not fl and not peek and ended == 0 then
    if c > 0 then return pre[q] .. num(c), ttl[q] end
    return nil, nil
  end
  local parts = {pre[q], num(c), '|', num(av), '/', ak, '/', dur}
  if peek or costed or ended > 0 then
    local marks = 0
    if peek then marks = 1 end
    if costed then marks = marks + 2 end
    parts[#parts + 1] = '/' .. marks
    if ended > 0 then parts[#parts + 1] = '/' .. num(ended) end
  end
  -- Flights never stretch the key past its window; the usage per check
  -- and the peek mark keep it through the next.
  local xe = 0
  if c > 0 or fl then xe = e[q] + GRACE end
  if fl then
    for j = 1, #fl, 3 do
      parts[#parts + 1] = format(';%d:%d:%d', fl[j], fl[j + 1], fl[j + 2])
    end
  end
  if ak > 0 or peek then xe = math.max(xe, e[q] + win[q] + GRACE) end
  return table.concat(parts), px(xe)
end

-- budgetval returns a fixed window's value and PX with a budget's state
-- (bs, or none) after act: 1 a budget check admitted goes in flight, 2 a charge of h lands, 3 a
-- budget check given back leaves the newest bucket (limit.unfly), 4 a
-- stream end read before any charge is counted (limit.readsEnd); a cost
-- check (cost) judged on it marks the budget costed; nil when nothing is
-- left to keep.
local function budgetval(q, h, c, act, bs, pair, pms, pflew, cost)
  local av, ak, dur, fl, peek, costed, ended = 0, 0, 0, nil, false, false, 0
  if bs then av, ak, dur, fl, peek, costed, ended = bs[1], bs[2], bs[3], bs[4], bs[5], bs[6], bs[7] end
  -- A cost check judged on a budget, admitted or not (limit.apply).
  if cost and ak > 0 then costed = true end
  if act == 1 then
    fl = fly(q, fl, dur, ak, pair)
  elseif act == 2 then
    av, ak, dur, fl = land(h, c, av, ak, dur, fl, pair, pms, pflew, ended)
    ended = 0
  elseif act == 3 then
    fl = endflight(fl, #fl - 2)
  elseif act == 4 then
    ended = math.min(ended + 1, c)
  end
  return budgetstate(q, c, av, ak, dur, fl, peek, costed, ended)
end

-- retry is limit.retryUS: a budget check refused for its flights resets
-- when the oldest flight expires, or at the window's end if sooner.
local function retry(q, bs, pair)
  if not bs or not bs[4] then return e[q] - now end
  local at = (bs[4][2] + horizon(q, bs[3], bs[2], pair) + 1) * 1000
  return math.max(math.min(at, e[q]) - now, 0)
end
