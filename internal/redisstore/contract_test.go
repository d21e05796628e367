package redisstore

import (
	"flag"
	"os"
	"regexp"
	"testing"

	"github.com/ratelimitd/ratelimitd/internal/limit"
)

var updateContract = flag.Bool("update-contract", false, "rewrite scripts/contract.lua from contract.go")

// TestScriptContractCurrent: scripts/contract.lua is what contract.go
// renders (go generate rewrites it), and no script declares one of its
// names again, so each number of the contract is written once, in Go.
func TestScriptContractCurrent(t *testing.T) {
	want := contractLua()
	if *updateContract {
		if err := os.WriteFile("scripts/contract.lua", []byte(want), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	got, err := scriptFS.ReadFile("scripts/contract.lua")
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != want && !*updateContract {
		t.Errorf("scripts/contract.lua is stale: run go generate ./internal/redisstore")
	}
	entries, err := scriptFS.ReadDir("scripts")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if e.Name() == "contract.lua" {
			continue
		}
		src, err := scriptFS.ReadFile("scripts/" + e.Name())
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range scriptConstants {
			if regexp.MustCompile(`(?m)^\s*local [A-Z_, ]*\b` + c.name + `\b[A-Z_, ]* =`).Match(src) {
				t.Errorf("%s declares %s again: it is contract.lua's", e.Name(), c.name)
			}
		}
	}
}

// TestScriptContractFits: the packed fields do not overlap: the flags,
// the kind and the pair flag below the rule's unit, the rule below the
// hits'; a rule's algorithm below its calendar, its calendar below its
// flight.
func TestScriptContractFits(t *testing.T) {
	if flagBig*2 > kindUnit || 4*kindUnit > flagPair || flagPair*2 > flagMark || flagMark*2 > ruleUnit || (maxRules+1)*ruleUnit > 1<<hitsShift {
		t.Errorf("packed fields overlap: flags up to %d, kinds from %d, the pair flag %d, rules from %d, %d rules, hits from 2^%d", flagBig, kindUnit, flagPair, ruleUnit, maxRules, hitsShift)
	}
	if int64(limit.CalendarYear)*calendarUnit >= flightUnit || int64(limit.TokenBucket) >= calendarUnit {
		t.Errorf("a rule's packed algorithm, calendar and flight overlap")
	}
}
