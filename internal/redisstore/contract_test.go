package redisstore

import (
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/ratelimitd/ratelimitd/internal/limit"
)

// TestScriptContract holds decide.lua's named constants to the Go ones of
// the same meaning: how script.go packs a key's and a rule's arguments,
// the algorithms, the usage kinds, a budget's horizon and the counts'
// saturation. A number changed on one side only fails here, not in a
// decision some traffic happens to reach.
func TestScriptContract(t *testing.T) {
	for script, want := range map[string]map[string]int64{
		"decide.lua": {
			"HITS_UNIT": 1 << hitsShift, "RULE_UNIT": ruleUnit, "KIND_UNIT": kindUnit,
			"FLAG_REFUND": flagRefund, "FLAG_NO_VETO": flagNoVeto, "FLAG_USAGE": flagUsage, "FLAG_BIG": flagBig, "FLAG_PAIR": flagPair,
			"CALENDAR_UNIT": calendarUnit, "FLIGHT_UNIT": flightUnit,
			"FIXED_WINDOW": int64(limit.FixedWindow), "SLIDING_WINDOW": int64(limit.SlidingWindow), "TOKEN_BUCKET": int64(limit.TokenBucket),
			"BY_HITS": int64(limit.ByHits), "ZERO_CHARGE": int64(limit.ZeroCharge), "COST_CHECK": int64(limit.CostCheck), "PLAIN_CHARGE": int64(limit.PlainCharge),
			"MIN_FLIGHT": limit.MinFlightMS, "COLD_FLIGHT": limit.ColdFlightMS, "SAMPLE_CHARGES": limit.SampleCharges, "COLD_IN_FLIGHT": limit.ColdInFlight,
			"AVG_CHARGES": limit.AvgCharges,
			"MAXC":        limit.MaxCount, "MAXSC": limit.MaxSlidingCount,
		},
		"grant.lua": {
			"TAKE": grantTake, "GIVE_BACK": grantGiveBack,
			"SLIDING_WINDOW": int64(limit.SlidingWindow), "TOKEN_BUCKET": int64(limit.TokenBucket),
		},
	} {
		lua := luaConstants(t, script)
		for name, w := range want {
			got, ok := lua[name]
			switch {
			case !ok:
				t.Errorf("%s declares no %s", script, name)
			case got != w:
				t.Errorf("%s's %s = %d, Go's %d", script, name, got, w)
			}
		}
	}
	// Packed fields must not overlap: the flags, the kind and the pair
	// flag below the rule's unit, the rule below the hits'.
	if flagBig*2 > kindUnit || 4*kindUnit > flagPair || flagPair*2 > ruleUnit || (maxRules+1)*ruleUnit > 1<<hitsShift {
		t.Errorf("packed fields overlap: flags up to %d, kinds from %d, the pair flag %d, rules from %d, %d rules, hits from 2^%d", flagBig, kindUnit, flagPair, ruleUnit, maxRules, hitsShift)
	}
	if int64(limit.CalendarYear)*calendarUnit >= flightUnit || int64(limit.TokenBucket) >= calendarUnit {
		t.Errorf("a rule's packed algorithm, calendar and flight overlap")
	}
}

// luaConstants reads the constants a script declares at the start of a
// line: local NAME[, NAME...] = number[, number...].
func luaConstants(t *testing.T, script string) map[string]int64 {
	t.Helper()
	src, err := scriptFS.ReadFile("scripts/" + script)
	if err != nil {
		t.Fatal(err)
	}
	lua := map[string]int64{}
	decl := regexp.MustCompile(`(?m)^local ([A-Z_][A-Z0-9_]*(?:, [A-Z_][A-Z0-9_]*)*) = ([0-9]+(?:, [0-9]+)*)$`)
	for _, m := range decl.FindAllStringSubmatch(string(src), -1) {
		names, vals := strings.Split(m[1], ", "), strings.Split(m[2], ", ")
		if len(names) != len(vals) {
			t.Fatalf("%s: %q: %d names, %d values", script, m[0], len(names), len(vals))
		}
		for i, n := range names {
			v, err := strconv.ParseInt(vals[i], 10, 64)
			if err != nil {
				t.Fatalf("%s: %s = %q: %v", script, n, vals[i], err)
			}
			lua[n] = v
		}
	}
	return lua
}
