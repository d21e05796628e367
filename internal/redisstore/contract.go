package redisstore

import (
	"fmt"
	"strings"

	"github.com/ratelimitd/ratelimitd/internal/limit"
)

//go:generate go test . -run TestScriptContractCurrent -update-contract

// scriptConstants are the numbers the scripts share with Go, each
// written once, here: scripts/contract.lua is rendered from them
// (go generate; TestScriptContractCurrent fails while it is stale) and
// sent in front of every script, before prelude.lua. A script declares
// none of them itself.
var scriptConstants = []struct {
	name  string
	value int64
	doc   string
}{
	{"HITS_UNIT", 1 << hitsShift, "a counter key's argument: hits * HITS_UNIT + rule * RULE_UNIT (rule 1-based) + flags"},
	{"RULE_UNIT", ruleUnit, ""},
	{"KIND_UNIT", kindUnit, "the usage kind (limit.UsageKind) in the flags: kind * KIND_UNIT"},
	{"FLAG_REFUND", flagRefund, "the flags: a refund (is_negative_hits)"},
	{"FLAG_NO_VETO", flagNoVeto, "shadow: over, it does not refuse the request"},
	{"FLAG_USAGE", flagUsage, "a rule that takes usage after the fact"},
	{"FLAG_BIG", flagBig, "the hits (2^32 or more) are the value at that 1-based place after the keys' values"},
	{"FLAG_PAIR", flagPair, "the check carries a request id; its pair key is the next after the counter keys"},
	{"FLAG_MARK", flagMark, "the charge carries a mark: its marks key is the next after the pair keys, its bit the next of the marks' offsets"},
	{"RULE_ARGS", ruleArgs, "a rule's arguments: limit, window_us, algorithm + CALENDAR_UNIT * calendar + FLIGHT_UNIT * flight seconds, burst"},
	{"CALENDAR_UNIT", calendarUnit, ""},
	{"FLIGHT_UNIT", flightUnit, ""},
	{"FIXED_WINDOW", int64(limit.FixedWindow), "the algorithms (limit.Algorithm)"},
	{"SLIDING_WINDOW", int64(limit.SlidingWindow), ""},
	{"TOKEN_BUCKET", int64(limit.TokenBucket), ""},
	{"BY_HITS", int64(limit.ByHits), "the usage kinds (limit.UsageKind)"},
	{"ZERO_CHARGE", int64(limit.ZeroCharge), ""},
	{"COST_CHECK", int64(limit.CostCheck), ""},
	{"PLAIN_CHARGE", int64(limit.PlainCharge), ""},
	{"COST_FLAGS", flagUsage + int64(limit.CostCheck)*kindUnit, "the flags of a request that costs its hits on a usage rule: the fast path takes it"},
	{"MIN_FLIGHT", limit.MinFlightMS, "a budget's learned horizon (limit.FlightMS), ms"},
	{"COLD_FLIGHT", limit.ColdFlightMS, ""},
	{"SAMPLE_CHARGES", limit.SampleCharges, ""},
	{"COLD_IN_FLIGHT", limit.ColdInFlight, ""},
	{"BUCKETS", limit.FlightBuckets, ""},
	{"AVG_CHARGES", limit.AvgCharges, "the charges the usage per check follows (limit.AvgCharges)"},
	{"MAXC", limit.MaxCount, "where a charged count saturates: fixed (limit.MaxCount), sliding (limit.MaxSlidingCount)"},
	{"MAXSC", limit.MaxSlidingCount, ""},
	{"MAXDEBT", limit.MaxDebtUS, "how far charges push a bucket's arrival time (limit.MaxDebtUS)"},
	{"GRACE", limit.GraceUS, "how long a key outlives the moment its state stops mattering (limit.GraceUS)"},
	{"TAKE", grantTake, "grant.lua's ops, and how many arguments each takes"},
	{"GIVE_BACK", grantGiveBack, ""},
	{"SETTLE", grantSettle, ""},
	{"GRANT_ARGS", grantArgs, ""},
}

// ruleArgs is how many arguments each distinct rule of a call takes.
const ruleArgs = 4

// contractLua renders scriptConstants as scripts/contract.lua.
func contractLua() string {
	var b strings.Builder
	b.WriteString("-- contract.lua: generated from redisstore's contract.go by go generate;\n" +
		"-- do not edit. The numbers every script shares with Go, sent in front\n" +
		"-- of each (before prelude.lua).\n")
	for _, c := range scriptConstants {
		if c.doc != "" {
			fmt.Fprintf(&b, "-- %s\n", c.doc)
		}
		fmt.Fprintf(&b, "local %s = %d\n", c.name, c.value)
	}
	return b.String()
}
