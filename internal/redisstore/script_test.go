package redisstore

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ratelimitd/ratelimitd/internal/limit"
)

var update = flag.Bool("update", false, "rewrite testdata/*.golden")

// TestScriptArgsGolden pins how requests are encoded for decide.lua (its
// header documents the layout): a change to the encoding must show here,
// and in the script, together.
func TestScriptArgsGolden(t *testing.T) {
	goldenArgs(t, "script_args.golden", [][]limit.Check{
		{
			{Key: "a", Limit: 5, WindowUS: 60e6, Hits: 1},
			{Key: "b", Limit: 10, WindowUS: 1e6, Hits: 3, Algorithm: limit.SlidingWindow, NoVeto: true},
		},
		{
			{Key: "c", Limit: 5, WindowUS: 60e6, Hits: 2, Refund: true},
			{Key: "d", Limit: 7, WindowUS: 3600e6, Hits: 0, Algorithm: limit.TokenBucket, Burst: 20},
			{Key: "e", Limit: 5, WindowUS: 60e6, Hits: 1 << 40}, // saturates at limit.MaxHits
			// A budget check: the usage flag, and the seconds in flight
			// packed with the algorithm.
			{Key: "f", Limit: 1000, WindowUS: 3600e6, Hits: 0, Usage: true, FlightS: 300},
			// A calendar month: packed with the algorithm too.
			{Key: "g", Limit: 1e6, WindowUS: limit.CalendarMonthUS, Hits: 5, Calendar: limit.CalendarMonth},
			// Hits past 2^32 go after the keys' values.
			{Key: "h", Limit: limit.MaxLimit, WindowUS: 3600e6, Hits: 1 << 45, Usage: true, FlightS: 60},
		},
		{
			// The usage kinds, packed above the flags.
			{Key: "i", Limit: 1000, WindowUS: 3600e6, Hits: 0, Usage: true, Kind: limit.ZeroCharge, FlightS: 300},
			{Key: "j", Limit: 1000, WindowUS: 3600e6, Hits: 1, Usage: true, Kind: limit.CostCheck, FlightS: 300},
			{Key: "k", Limit: 1000, WindowUS: 3600e6, Hits: 5, Usage: true, Kind: limit.PlainCharge, FlightS: 300},
			// A marked charge: its marks key after the pair keys, its
			// bit before the keys' values.
			{Key: "l", Limit: 1000, WindowUS: 3600e6, Hits: 7, Usage: true, FlightS: 300, MarkKey: "{l}|charged|i|1", MarkOff: 9},
		},
	})
	// Every request of one key: no count per request, -R instead of R.
	goldenArgs(t, "script_args_ones.golden", [][]limit.Check{
		{{Key: "a", Limit: 5, WindowUS: 60e6, Hits: 1}},
		{{Key: "b", Limit: 5, WindowUS: 60e6, Hits: 2}},
		{{Key: "c", Limit: 10, WindowUS: 1e6, Hits: 1, Algorithm: limit.SlidingWindow}},
	})
}

// goldenArgs compares how reqs are encoded with testdata/name.
func goldenArgs(t *testing.T, name string, reqs [][]limit.Check) {
	t.Helper()
	keys, args, err := (&Store{}).scriptArgs(reqs)
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "KEYS %s\n", strings.Join(keys, " "))
	for i, a := range args {
		fmt.Fprintf(&b, "ARGV[%d] %v\n", i+1, a)
	}
	golden := filepath.Join("testdata", name)
	if *update {
		if err := os.WriteFile(golden, []byte(b.String()), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatalf("%v (run with -update to write it)", err)
	}
	if got := b.String(); got != string(want) {
		t.Errorf("script arguments changed:\n%s\nwant:\n%s", got, want)
	}
}
