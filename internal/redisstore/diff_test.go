package redisstore_test

// The script held to limit (memstore) on calendar periods and budgets.

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/internal/limit"
	"github.com/ratelimitd/ratelimitd/internal/memstore"
	"github.com/ratelimitd/ratelimitd/internal/redisstore"
	"github.com/ratelimitd/ratelimitd/internal/redisstore/redistest"
)

// TestCalendarMatchesMemstore holds the script's calendar periods (its
// own date arithmetic) to limit.Decide's (Go's time package) across
// month and year ends, leap days and centuries: the same decisions, and
// resets that end exactly at the period's end.
func TestCalendarMatchesMemstore(t *testing.T) {
	srv := redistest.Start(t)
	var clock atomic.Int64
	now := func() time.Time { return time.UnixMicro(clock.Load()) }
	rs := newStore(t, srv, now)
	ms := memstore.New(memstore.Options{Now: now})
	ctx := context.Background()
	for _, at := range []string{"2026-12-31T23:59:58Z", "2027-01-31T23:59:59Z", "2028-02-28T23:59:58Z", "2028-02-29T23:59:59Z",
		"2029-02-28T23:59:59Z", "2100-02-28T23:59:59Z", "2000-02-29T23:59:59Z", "2027-04-30T23:59:59Z", "2026-12-04T10:00:00Z"} {
		start, err := time.Parse(time.RFC3339, at)
		if err != nil {
			t.Fatal(err)
		}
		clock.Store(start.UnixMicro())
		for step := range 6 {
			for _, c := range []limit.Check{
				{Key: "m:" + at, Limit: 5, WindowUS: limit.CalendarMonthUS, Hits: 2, Calendar: limit.CalendarMonth},
				{Key: "y:" + at, Limit: 3, WindowUS: limit.CalendarYearUS, Hits: 1, Calendar: limit.CalendarYear, Usage: true, FlightS: 60},
			} {
				got, err := rs.Evaluate(ctx, []limit.Check{c})
				if err != nil {
					t.Fatal(err)
				}
				want, _ := ms.Evaluate(ctx, []limit.Check{c})
				if got[0] != want[0] {
					t.Fatalf("%s step %d %s: redis %+v, memstore %+v", at, step, c.Key, got[0], want[0])
				}
				_, end := c.Window(clock.Load())
				if got[0].ResetUS != end-clock.Load() {
					t.Fatalf("%s step %d %s: reset %d µs, want the period's end %s", at, step, c.Key, got[0].ResetUS, time.UnixMicro(end).UTC())
				}
			}
			clock.Add(700_000)
		}
	}
}

// TestBudgetMatchesMemstore drives token budgets the way streams do —
// checks, cost checks, charges, zero charges, requests stating no hits,
// at millisecond gaps that let flights expire and durations be learned —
// in Redis and in limit.Decide (memstore): every decision identical.
func TestBudgetMatchesMemstore(t *testing.T) {
	rs, ms, clock := twoStores(t)
	// The same traffic against the same window ends every run (a second
	// into a minute): where a window ended decided whether some bugs
	// showed (plant 244 was missed once of three runs).
	clock.Store(time.Now().Truncate(time.Minute).Add(time.Second).UnixMicro())
	rng := rand.New(rand.NewPCG(11, 12))
	limits := []uint64{0, 3000, 20_000, 1_000_000}
	held, givenBack := 0, 0
	for i := range 4000 {
		switch r := rng.IntN(50); {
		case r == 0:
			clock.Add(rng.Int64N(30e6)) // past any horizon, sometimes a window
		case r < 30:
			clock.Add(rng.Int64N(300e3))
		}
		n := 1 + rng.IntN(2)
		checks := make([]limit.Check, 0, n)
		seen := map[string]bool{}
		for range n {
			li := rng.IntN(len(limits))
			key := fmt.Sprintf("u%d:%d", li, rng.IntN(2))
			if seen[key] {
				continue
			}
			seen[key] = true
			// --usage-timeout (FlightS) varies from call to call, but a
			// request's two calls share it, as a process's do.
			flightS := 1 + rng.Int64N(20)
			if rng.IntN(2) == 0 {
				// A request id: its second call is its stream end.
				flightS = 3 + int64(li)
			}
			c := limit.Check{Key: key, Limit: limits[li], WindowUS: 60e6, Usage: true, FlightS: flightS,
				Kind: limit.UsageKind(rng.IntN(4))}
			switch c.Kind {
			case limit.ByHits:
				if rng.IntN(2) == 0 {
					c.Hits = uint64(rng.IntN(3000))
				}
			case limit.CostCheck:
				c.Hits = uint64(1 + rng.IntN(3))
			case limit.PlainCharge:
				c.Hits = uint64(1 + rng.IntN(3000))
			}
			if flightS == 3+int64(li) {
				c.PairID = fmt.Sprintf("r%d", rng.IntN(4))
			}
			checks = append(checks, c)
		}
		res := mustMatch(t, rs, ms, checks, i, clock)
		admitted := true
		for _, r := range res {
			if r.Over && r.Remaining > 0 {
				held++
			}
			admitted = admitted && !r.Over
		}
		if admitted && rng.IntN(6) == 0 {
			// Given back, as limit.EvaluateInOrder gives back what an
			// earlier hash slot consumed when a later one refuses: a
			// budget check leaves its flight.
			var back []limit.Check
			for _, c := range checks {
				if !c.Charge() && c.PairID == "" {
					c.Refund = true
					back = append(back, c)
				}
			}
			if len(back) > 0 {
				mustMatch(t, rs, ms, back, i, clock)
				givenBack++
			}
		}
	}
	t.Logf("%d requests given back", givenBack)
	if held == 0 {
		t.Fatal("no check was held for its flights: the test drives nothing of the bound")
	}
	t.Logf("%d refusals held by flights alone, identical", held)
}

// TestBudgetUsageFollowsCharges: the script's usage per check follows the
// latest charges (a moving average of the last 256), as limit's does:
// after 300 streams of 100 tokens and 300 of 10,000, the checks that fill
// what is left stop where memstore's stop (a mean of all 600 would admit
// a third more).
func TestBudgetUsageFollowsCharges(t *testing.T) {
	rs, ms, clock := twoStores(t)
	c := limit.Check{Key: "follow", Limit: 3_130_000, WindowUS: 3600e6, Usage: true, FlightS: 300}
	i := 0
	call := func(hits uint64) limit.Result {
		ch := c
		ch.Hits = hits
		i++
		return mustMatch(t, rs, ms, []limit.Check{ch}, i, clock)[0]
	}
	for _, tokens := range []uint64{100, 10_000} {
		for range 300 {
			if call(0).Over {
				t.Fatalf("request %d: a check refused while one stream at a time charges", i)
			}
			clock.Add(1000)
			call(tokens)
		}
	}
	// 100,000 left: about 14 checks at the latest usage per check
	// (~7,000), 20 at the mean of every charge (5,050).
	admitted := 0
	for !call(0).Over {
		admitted++
	}
	if admitted < 10 || admitted > 16 {
		t.Fatalf("%d checks admitted on 100,000 left after charges of 10,000, want 10-16 (the latest charges weigh most)", admitted)
	}
}

// TestBudgetFirstWaveMatchesMemstore: the duration a first wave keeps
// teaching past the first charges (limit.firstWave) is the script's too:
// the retry of a check held by the wave's flights, when the oldest
// expires, is the same in both stores (1.98 s, twice the 990 ms learned;
// 1.26 s had the script stopped learning at the 64th charge).
func TestBudgetFirstWaveMatchesMemstore(t *testing.T) {
	rs, ms, clock := twoStores(t)
	clock.Store(clock.Load() / 1000 * 1000) // on a ms: the flights count in ms
	c := limit.Check{Key: "wave", Limit: 1 << 40, WindowUS: 3600e6, Usage: true, FlightS: 60}
	i := 0
	call := func(budget, hits uint64) limit.Result {
		ch := c
		ch.Limit, ch.Hits = budget, hits
		i++
		return mustMatch(t, rs, ms, []limit.Check{ch}, i, clock)[0]
	}
	call(c.Limit, 0)
	clock.Add(10_000)
	call(c.Limit, 1000)
	for range 200 {
		if call(c.Limit, 0).Over {
			t.Fatal("a check of the wave refused")
		}
	}
	for range 99 {
		clock.Add(10_000)
		call(c.Limit, 1000)
	}
	// 100,000 charged, 101 in flight at about 1,000: a budget of 150,000
	// is held by the flights.
	r := call(150_000, 0)
	if !r.Over || r.Remaining != 50_000 || r.ResetUS != (2*990+1)*1000-990_000 {
		t.Fatalf("a check held by the wave's flights: %+v, want over, 50,000 left, retry in %d us", r, (2*990+1)*1000-990_000)
	}
	// A flood of 300 uncharged checks on a counter of 100 charges of
	// 200 ms streams, with one stream charging every 50 ms: the script
	// caps what each charge teaches as Go does (by 8/n of the duration),
	// and the flood expires in both alike.
	c.Key = "flood"
	for range 100 {
		call(c.Limit, 0)
		clock.Add(200_000)
		call(c.Limit, 1000)
	}
	for range 300 {
		call(c.Limit, 0)
	}
	for range 40 {
		clock.Add(50_000)
		call(c.Limit, 1000)
		call(c.Limit, 0)
		call(150_000, 0) // the flood's hold, and its retry, in both
	}
}

// TestExpiredCallsNotSent: a call whose caller has given up (its
// deadline passed or its context canceled) while it waited in the queue
// is never sent: its hits are not consumed after its caller was answered
// by the failure policy.
func TestExpiredCallsNotSent(t *testing.T) {
	s := newStore(t, redistest.Start(t), time.Now)
	check := func(hits uint64) []limit.Check {
		return []limit.Check{{Key: "late", Limit: 1000, WindowUS: 3600e6, Hits: hits}}
	}
	past, cancel := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
	defer cancel()
	canceled, cancel2 := context.WithCancel(context.Background())
	cancel2()
	for _, ctx := range []context.Context{past, canceled} {
		for range 50 {
			if _, err := s.Evaluate(ctx, check(1)); err == nil {
				t.Fatal("a call whose caller gave up answered without an error")
			}
		}
	}
	res, err := s.Evaluate(context.Background(), check(0))
	if err != nil {
		t.Fatal(err)
	}
	if res[0].Remaining != 1000 {
		t.Fatalf("%d left after 100 calls whose callers gave up, want 1000: they were sent", res[0].Remaining)
	}
}

// twoStores is a Redis store and memstore on one scripted clock.
func twoStores(t *testing.T) (*redisstore.Store, *memstore.Store, *atomic.Int64) {
	t.Helper()
	srv := redistest.Start(t)
	clock := new(atomic.Int64)
	// Ten minutes into an hour, whatever the wall clock says: a test
	// that moves the clock by seconds keeps its hour's window (one run
	// at 02:59:59 saw a budget's counter start afresh mid-test).
	clock.Store(time.Now().Truncate(time.Hour).Add(10 * time.Minute).UnixMicro())
	now := func() time.Time { return time.UnixMicro(clock.Load()) }
	return newStore(t, srv, now), memstore.New(memstore.Options{Now: now}), clock
}

// mustMatch has both stores decide request i and fails unless they agree.
func mustMatch(t *testing.T, rs *redisstore.Store, ms *memstore.Store, checks []limit.Check, i int, clock *atomic.Int64) []limit.Result {
	t.Helper()
	ctx := context.Background()
	got, err := rs.Evaluate(ctx, checks)
	if err != nil {
		t.Fatal(err)
	}
	want, _ := ms.Evaluate(ctx, checks)
	for j := range want {
		if got[j] != want[j] {
			t.Fatalf("request %d check %d %+v at %d: redis %+v, memstore %+v", i, j, checks[j], clock.Load(), got[j], want[j])
		}
	}
	return got
}

// TestBudgetFlightsMatchMemstore: a budget held near its end by checks in
// flight over many buckets, charged and expiring bucket by bucket,
// decides in the script as in limit: a charge ends the flight nearest the
// learned duration (not the oldest) and a bucket expires by its last
// admission (not its first); the refusals' resets, which name the oldest
// flight, tell. TestBudgetMatchesMemstore's random traffic reaches these
// on some seeds only.
func TestBudgetFlightsMatchMemstore(t *testing.T) {
	rs, ms, clock := twoStores(t)
	c := limit.Check{Key: "flights", Limit: 200_000, WindowUS: 3600e6, Usage: true, FlightS: 60}
	i := 0
	call := func(hits uint64) limit.Result {
		i++
		cc := c
		cc.Hits = hits
		return mustMatch(t, rs, ms, []limit.Check{cc}, i, clock)[0]
	}
	wait := func(ms int64) { clock.Add(ms * 1000) }
	// Twenty streams of 200 ms and 5,000 tokens: a duration to learn.
	for range 20 {
		call(0)
		wait(200)
		call(5_000)
	}
	rng := rand.New(rand.NewPCG(3, 5))
	held := 0
	for range 600 {
		if r := call(0); r.Over && r.Remaining > 0 {
			held++
		}
		wait(5 + rng.Int64N(40))
		if rng.IntN(3) == 0 {
			call(uint64(200 + rng.IntN(800)))
		}
		if rng.IntN(8) == 0 {
			wait(100 + rng.Int64N(300))
		}
	}
	if held < 50 {
		t.Fatalf("%d checks held for their flights: the test drives nothing of them", held)
	}
	t.Logf("%d refusals held by flights alone, identical", held)
}
