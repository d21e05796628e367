-- contract.lua: generated from redisstore's contract.go by go generate;
-- do not edit. The numbers every script shares with Go, sent in front
-- of each (before prelude.lua).
-- a counter key's argument: hits * HITS_UNIT + rule * RULE_UNIT (rule 1-based) + flags
local HITS_UNIT = 2097152
local RULE_UNIT = 256
-- the usage kind (limit.UsageKind) in the flags: kind * KIND_UNIT
local KIND_UNIT = 16
-- the flags: a refund (is_negative_hits)
local FLAG_REFUND = 1
-- shadow: over, it does not refuse the request
local FLAG_NO_VETO = 2
-- a rule that takes usage after the fact
local FLAG_USAGE = 4
-- the hits (2^32 or more) are the value at that 1-based place after the keys' values
local FLAG_BIG = 8
-- the check carries a request id; its pair key is the next after the counter keys
local FLAG_PAIR = 64
-- the charge carries a mark: its marks key is the next after the pair keys, its bit the next of the marks' offsets
local FLAG_MARK = 128
-- a rule's arguments: limit, window_us, algorithm + CALENDAR_UNIT * calendar + FLIGHT_UNIT * flight seconds, burst
local RULE_ARGS = 4
local CALENDAR_UNIT = 4
local FLIGHT_UNIT = 16
-- the algorithms (limit.Algorithm)
local FIXED_WINDOW = 0
local SLIDING_WINDOW = 1
local TOKEN_BUCKET = 2
-- the usage kinds (limit.UsageKind)
local BY_HITS = 0
local ZERO_CHARGE = 1
local COST_CHECK = 2
local PLAIN_CHARGE = 3
-- the flags of a request that costs its hits on a usage rule: the fast path takes it
local COST_FLAGS = 36
-- a budget's learned horizon (limit.FlightMS), ms
local MIN_FLIGHT = 250
local COLD_FLIGHT = 1000
local SAMPLE_CHARGES = 64
local COLD_IN_FLIGHT = 4
local BUCKETS = 16
-- the charges the usage per check follows (limit.AvgCharges)
local AVG_CHARGES = 256
-- where a charged count saturates: fixed (limit.MaxCount), sliding (limit.MaxSlidingCount)
local MAXC = 4503599627370496
local MAXSC = 8589934592
-- how far charges push a bucket's arrival time (limit.MaxDebtUS)
local MAXDEBT = 1125899906842624
-- how long a key outlives the moment its state stops mattering (limit.GraceUS)
local GRACE = 1000000
-- grant.lua's ops, and how many arguments each takes
local TAKE = 1
local GIVE_BACK = 2
local SETTLE = 3
local GRANT_ARGS = 9
