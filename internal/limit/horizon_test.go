package limit

// A budget's peeks, learned duration and horizon.

import (
	"fmt"
	"testing"
)

// TestPeeks: a call stating 0 on a counter never charged reads it: on a
// counter that holds a count at once, and on an empty one once the cold
// start's first horizon has passed without a charge; the mark serves the
// next window, and a charge makes the counter a budget.
func TestPeeks(t *testing.T) {
	b := newBudget(t, 10)
	b.call(CostCheck, 1)
	for range 20 {
		if r := b.check(); r.Over || r.Remaining != 9 {
			t.Fatalf("a peek on a counted counter: %+v, want admitted, 9 left", r)
		}
	}
	if st := b.state(); st.InFlight() != 0 || st.Count != 1 {
		t.Fatalf("peeks changed the counter: %+v", *st)
	}

	p := newBudget(t, 10)
	for range ColdInFlight {
		p.mustAdmit("a cold check")
	}
	p.mustRefuse("a fifth check within the cold start's horizon")
	p.ms(ColdFlightMS + 1)
	for range 100 {
		p.mustAdmit("a peek past the first horizon")
	}
	if st := p.state(); !st.Peek || st.InFlight() != 0 {
		t.Fatalf("after the cold start ran out: %+v, want a peek mark and nothing in flight", *st)
	}
	// The next window keeps the mark; the one after that starts cold.
	p.now += 3600e6
	for range 10 {
		p.mustAdmit("a peek in the next window")
	}
	p.now += 2 * 3600e6
	for range ColdInFlight {
		p.mustAdmit("a cold check two windows on")
	}
	p.mustRefuse("past the cold quota two windows on")
	// A charge makes a peeked counter a budget.
	p.ms(ColdFlightMS + 1)
	p.check()
	p.ms(100)
	p.charge(3)
	if st := p.state(); st.Charges != 1 {
		t.Fatalf("a charge on a peeked counter: %+v", *st)
	}
	for range 2 {
		p.mustAdmit("a budget check")
	}
	// 3 + 2 in flight x 3 x 2 >= 10.
	p.mustRefuse("a budget check past its flights")
}

// TestDurationLearned: the horizon follows how long streams last, from
// the first charges, and later only where few checks are in flight; a
// charge ends the flight nearest that duration.
func TestDurationLearned(t *testing.T) {
	b := newBudget(t, 1<<40)
	b.c.FlightS = 60
	if h := b.horizonMS(); h != ColdFlightMS {
		t.Fatalf("cold horizon %d, want %d", h, ColdFlightMS)
	}
	b.stream(800, 10)
	if st := b.state(); st.DurMS != 800 || b.horizonMS() != 1600 {
		t.Fatalf("duration %d, horizon %d; want 800 and 1600", st.DurMS, b.horizonMS())
	}
	// A charge after its flight expired (or was lost) teaches nothing of
	// the duration: only a flight's age does.
	b.mustAdmit("check")
	b.ms(40_000)
	b.charge(10)
	if st := b.state(); st.DurMS != 800 || st.InFlight() != 0 {
		t.Fatalf("a charge after its flight expired: duration %d, %d in flight; want 800 kept, none", st.DurMS, st.InFlight())
	}
	b.state().DurMS = 5000
	// Past the first charges, with three in flight, a charge learns
	// nothing and ends the flight nearest the duration, not the oldest.
	b.state().Charges = SampleCharges
	b.mustAdmit("old")
	b.ms(4000)
	b.mustAdmit("mid")
	b.ms(5000)
	b.mustAdmit("young")
	b.ms(10)
	b.charge(10)
	fl := b.state().Flights
	if len(fl) != 2 || b.now/1000-fl[0].FirstMS != 9010 || b.now/1000-fl[1].FirstMS != 10 || b.state().DurMS != 5000 {
		t.Fatalf("flights %+v at %d, duration %d: want the 5010 ms one ended (the nearest to 5000), 5000 kept", fl, b.now/1000, b.state().DurMS)
	}
	// Long streams: a later sample with at most two in flight raises it;
	// the ceiling is FlightS.
	b.state().Flights = nil
	b.mustAdmit("long")
	b.ms(9_000)
	b.charge(10)
	if b.state().DurMS != 9_000 {
		t.Fatalf("duration %d, want 9000 learned at low occupancy", b.state().DurMS)
	}
	b.state().DurMS = 50_000
	if b.horizonMS() != 60_000 {
		t.Fatalf("horizon %d, want the 60 s ceiling", b.horizonMS())
	}
	// With many in flight, an old (uncharged) flight teaches nothing.
	for range 5 {
		b.mustAdmit("many")
	}
	b.ms(55_000)
	b.mustAdmit("new")
	b.ms(10)
	b.charge(10)
	if b.state().DurMS != 50_000 {
		t.Fatalf("duration %d learned from a crowd, want 50000 kept", b.state().DurMS)
	}
}

// TestDurationLearnedInAFirstWave: past its first SampleCharges charges a
// counter keeps learning the duration from its oldest flight while a
// first wave is still running (fewer charges than checks in flight; its
// first charges were its shortest streams), not from a flood of checks
// more than four times its charges.
func TestDurationLearnedInAFirstWave(t *testing.T) {
	for _, tc := range []struct {
		checks int
		want   int64
	}{{200, 990}, {1000, 630}} {
		b := newBudget(t, 1<<40)
		b.c.FlightS = 60
		b.stream(10, 1000) // the usage per check known: the wave is admitted at once
		for range tc.checks {
			b.mustAdmit("wave")
		}
		// The wave's streams end 10 ms apart: the last charge comes when
		// the oldest flight is 990 ms old, the 64th at 630 ms.
		for range 99 {
			b.ms(10)
			b.charge(1000)
		}
		if st := b.state(); st.DurMS != tc.want || st.Charges != 100 {
			t.Errorf("%d checks in flight: duration %d ms after %d charges, want %d", tc.checks, st.DurMS, st.Charges, tc.want)
		}
	}
}

// TestFloodOnAYoungCounter: a flood of uncharged checks on a counter past
// its first 64 charges, two to four times its charges, looks like a first
// wave (nothing tells them apart), but each charge raises the duration by
// 8/n of it at most: the flood cannot carry it with its age, and expires
// within a few durations, not at --usage-timeout.
func TestFloodOnAYoungCounter(t *testing.T) {
	b := newBudget(t, 1<<40)
	b.c.FlightS = 300
	for range 100 {
		b.stream(10, 1000)
	}
	b.state().DurMS = 10_000 // streams of 10 s, as learned
	if st := b.state(); st.Charges != 100 {
		t.Fatalf("%d charges, want 100", st.Charges)
	}
	for range 300 {
		b.mustAdmit("flood")
	}
	// Four streams of 10 s go on: a charge and a check every 2.5 s.
	for i := range 40 {
		b.ms(2500)
		b.charge(1000)
		b.mustAdmit("stream")
		if n := b.state().InFlight(); n < 100 {
			if i > 12 {
				t.Errorf("the flood expired %d s after it, want within 32.5 s (twice the 10 s duration and a half)", (i+1)*5/2)
			}
			return
		}
	}
	t.Fatalf("the flood still in flight 100 s after it: duration %d ms", b.state().DurMS)
}

// TestFlightsKeepTheWindowTTL: checks in flight never keep a key past
// its window (the usage per check keeps it through the next).
func TestFlightsKeepTheWindowTTL(t *testing.T) {
	c := []Check{{Key: "k", Limit: 100, WindowUS: 60e6, Usage: true, FlightS: 86400}}
	st, found := []State{{}}, []bool{false}
	res, exp := make([]Result, 1), make([]int64, 1)
	Decide(c, st, found, 59e6, res, exp)
	if exp[0] != 60e6+GraceUS {
		t.Fatalf("expiry %d, want the window's end %d", exp[0], int64(60e6+GraceUS))
	}
}

// TestUsageFlightsNotShared: a stored state's flights are never written
// through, since a store may hand the same slice to two decisions.
func TestUsageFlightsNotShared(t *testing.T) {
	// The newest bucket is young enough to take the check (a write in
	// place would change its N), and a spare slot holds another (an
	// append in place would overwrite it).
	base := State{End: 60e6, Count: 1, Avg: 5 * AvgScale, Charges: 1, DurMS: 100, Flights: []Flight{{FirstMS: 995, LastMS: 995, N: 2}}}
	base.Flights = append(base.Flights, Flight{FirstMS: 996, LastMS: 996, N: 1})[:1:2]
	c := []Check{{Key: "k", Limit: 1000, WindowUS: 60e6, Usage: true, FlightS: 60}}
	for _, hits := range []uint64{0, 10} {
		st := []State{base}
		c[0].Hits = hits
		decide(t, c, st, []bool{true}, 1e6)
		if base.Flights[0].N != 2 || len(base.Flights) != 1 || base.Flights[:2][1].N != 1 {
			t.Fatalf("hits %d: the shared flights changed: %+v", hits, base.Flights[:2])
		}
	}
}

// TestUsageMeanFollowsCharges: the usage per check is the mean of the
// charges while fewer than AvgCharges came, then a moving average that
// follows a change in usage.
func TestUsageMeanFollowsCharges(t *testing.T) {
	st := State{End: 3600e6}
	c := Check{Limit: 1 << 31, WindowUS: 3600e6, Usage: true, FlightS: 60}
	for i := range 2 * AvgCharges {
		fly(&c, &st, 1)
		land(&st, 1, uint64(1000+2000*(i%2)))
	}
	if st.Charges != AvgCharges || st.Avg < 1990*AvgScale || st.Avg > 2010*AvgScale {
		t.Fatalf("mean %v of %d charges, want 2000 of %d", float64(st.Avg)/AvgScale, st.Charges, AvgCharges)
	}
	for range 4 * AvgCharges {
		fly(&c, &st, 1)
		land(&st, 1, 10)
	}
	if st.Avg > 50*AvgScale {
		t.Fatalf("mean %v after usage fell to 10, want it followed", float64(st.Avg)/AvgScale)
	}
}

// TestPairedHorizon: a counter whose streams end paired (a request id)
// learns their exact duration, and once AvgCharges of them have taught
// it, keeps a check in flight for 1.25 times it instead of twice; a
// paired stream end ends its own check's flight, not the oldest.
func TestPairedHorizon(t *testing.T) {
	b := newBudget(t, 1<<40)
	b.c.FlightS = 60
	pairMS, flew := int64(0), false
	call := func(id string, hits uint64) {
		c := []Check{b.c}
		c[0].Hits, c[0].PairID = hits, id
		b.st[0].PairMS, b.st[0].PairFlew = pairMS, flew
		decide(b.t, c, b.st, b.found, b.now)
		pairMS, flew = b.st[0].PairMS, b.st[0].PairFlew
	}
	for i := range AvgCharges {
		call(fmt.Sprint(i), 0)
		if i == 0 && (pairMS == 0 || !flew) {
			t.Fatalf("a paired check: pair %d, flew %v", pairMS, flew)
		}
		b.ms(1000)
		call(fmt.Sprint(i), 1000)
		if pairMS != 0 {
			t.Fatalf("a paired stream end left its pair: %d", pairMS)
		}
		if i == 0 && b.state().DurMS != 1000 {
			t.Fatalf("duration %d ms after a 1 s stream, want 1000", b.state().DurMS)
		}
	}
	c := b.c
	c.PairID = "x"
	if got := FlightMS(&c, b.state()); got != 1250 {
		t.Fatalf("paired horizon %d ms, want 1250 (unpaired %d)", got, FlightMS(&b.c, b.state()))
	}
	// Two checks 500 ms apart; the younger's end ends its own flight.
	call("old", 0)
	oldMS := b.state().Flights[len(b.state().Flights)-1].FirstMS
	pairMS, flew = 0, false
	b.ms(500)
	call("young", 0)
	b.ms(100)
	call("young", 1000)
	if fl := b.state().Flights; len(fl) != 1 || fl[0].FirstMS != oldMS {
		t.Fatalf("flights %+v, want only the old check's (admitted at %d)", fl, oldMS)
	}
}
