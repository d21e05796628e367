package global

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/internal/limit"
)

// budgetEntry is a global budget's entry as the store holds it mid-window:
// the home heard 10 ms ago with left of 10,000, avail held, streams
// estimated at 1,000 each. No goroutine runs: the accounting rules are
// called directly.
func budgetEntry(now time.Time, avail, left uint64) (*Store, *entry) {
	s := &Store{opts: Options{Refresh: 250 * time.Millisecond}, now: func() time.Time { return now }, entries: map[string]*entry{},
		wake: make(chan struct{}, 1), coldWake: make(chan struct{}, 1)}
	c := limit.Check{Key: "g:b", Limit: 10_000, WindowUS: 3600e6, Usage: true}
	e := &entry{check: c, avail: avail, remaining: left, usage: true, perCheck: 1000, charges: 10,
		windowEnd: 1, resetAt: now.Add(time.Hour / 2), validTill: now.Add(time.Hour / 2), heard: now.Add(-10 * time.Millisecond), lastUse: now}
	s.entries[c.Key] = e
	return s, e
}

// TestChargesBeyondHoldsPaidHere: a stream charging past its hold owes
// the rest; what the next stream charges below its hold pays that debt
// here, and a budget check pays what is owed before it is admitted, so
// that what a window's streams overspend is met by what others
// underspend, not settled on top of what was granted (a budget at 3×
// offered went 1.09× its budget so).
func TestChargesBeyondHoldsPaidHere(t *testing.T) {
	now := time.Now()
	s, e := budgetEntry(now, 0, 0)
	e.flights = []flight{{at: now, hits: 1000}, {at: now, hits: 1000}}
	// The first stream charges 1,500: its 1,000, and 500 owed.
	if _, owed := s.spend(e, 1500, now); !owed || e.owedNow() != 500 {
		t.Fatalf("a charge of 1,500 on a hold of 1,000 with nothing else held: owes %d, want 500", e.owedNow())
	}
	// The second charges 600 of its 1,000: the 400 left pay the debt.
	s.spend(e, 600, now)
	if e.owedNow() != 100 || e.avail != 0 {
		t.Errorf("after a charge of 600 on a hold of 1,000: owed %d, held %d; want 100 owed, nothing held", e.owedNow(), e.avail)
	}
	// Hits drawn pay it before a check is admitted on them.
	e.avail = 1050
	e.flights = []flight{{at: now, hits: 1000}}
	var p plan
	p.now = now
	p.results = make([]limit.Result, 1)
	c := e.check
	s.budgetCheck(&p, 0, &c, e, true)
	if e.owedNow() != 0 {
		t.Errorf("a budget check with 1,050 held and 100 owed: %d still owed", e.owedNow())
	}
	if !p.refused {
		t.Errorf("a budget check with 950 held once 100 owed are paid, streams estimated at 1,000, one in flight: admitted, want refused")
	}
}

// TestDebtsSettledSoonAnyway: a debt of the window in force waits to be
// paid here at most repayWithin refreshes, and never into the window's
// last two leads; then it is settled at the home, so that the home's
// count trails the charges by a second at most. A debt of another window
// is settled at once.
func TestDebtsSettledSoonAnyway(t *testing.T) {
	now := time.Now()
	s, e := budgetEntry(now, 0, 0)
	e.owe(e.windowEnd, 300, now)
	if ops := s.settleOps(e, false); len(ops) != 0 {
		t.Errorf("a debt just owed in the window in force: settled at once (%+v), want it left to be paid here", ops)
	}
	later := now.Add(repayWithin * s.opts.Refresh)
	s.now = func() time.Time { return later }
	if ops := s.settleOps(e, false); len(ops) != 1 || ops[0].Check.Hits != 300 {
		t.Errorf("a debt owed %d refreshes ago: settles %+v, want its 300", repayWithin, ops)
	}
	s, e = budgetEntry(now, 0, 0)
	e.resetAt = now.Add(2*s.opts.Refresh - time.Millisecond)
	e.owe(e.windowEnd, 300, now)
	if ops := s.settleOps(e, false); len(ops) != 1 {
		t.Errorf("a debt owed in its window's last two leads: not settled, want settled")
	}
	s, e = budgetEntry(now, 0, 0)
	e.owe(e.windowEnd+e.check.WindowUS, 300, now)
	if ops := s.settleOps(e, false); len(ops) != 1 {
		t.Errorf("a debt of the next window: not settled, want settled at once")
	}
}

// TestLowBudgetPooled: once the home's rest covers fewer than
// pooledStreams streams, an instance keeps one stream's worth beyond its
// flights and gives the rest back (for the instances short of one), and
// draws a stream at a time (again, once hits given back are read at the
// home); with more left, it holds what its demand wants.
func TestLowBudgetPooled(t *testing.T) {
	now := time.Now()
	s, e := budgetEntry(now, 5000, 3000)
	ops, _ := s.passOps(now, false)
	if len(ops) != 1 || !ops[0].GiveBack || ops[0].Check.Hits != 4000 || e.avail != 1000 {
		t.Errorf("5,000 held with 3,000 left at the home, streams of 1,000: %+v, holding %d; want 4,000 given back, 1,000 kept", ops, e.avail)
	}
	s, e = budgetEntry(now, 0, 3000)
	e.waiting = 1000
	if n := s.drawSize(e, now, s.opts.Refresh); n != 1000 {
		t.Errorf("nothing held, 3,000 left at the home, a check waiting: draws %d, want a stream's 1,000", n)
	}
	// A budget read dry draws nothing until the window's end, but hits
	// given back since, read at the next refresh, are drawn again.
	s, e = budgetEntry(now, 0, 0)
	e.dryUntil = e.resetAt
	s.granted(e, 0, limit.GrantResult{Remaining: 3000, ResetUS: (time.Hour / 2).Microseconds(), WindowEndUS: 1}, now)
	e.waiting = 1000
	if n := s.drawSize(e, now, s.opts.Refresh); n != 1000 {
		t.Errorf("read dry, then 3,000 given back to the home, a check waiting: draws %d, want 1,000", n)
	}
	s, _ = budgetEntry(now, 5000, 9000)
	ops, _ = s.passOps(now, false)
	for _, op := range ops {
		if op.GiveBack {
			t.Errorf("5,000 held with 9,000 left at the home: gives back %d, want it kept", op.Check.Hits)
		}
	}
}

// TestFullStoreForgetsIdleCounters: a store holding maxEntries counters
// makes room for a new key by forgetting one unasked for evictAfter (its
// hits dropped: the bound holds), and refuses the new key only while
// every counter it looks at was asked since or has something under way.
func TestFullStoreForgetsIdleCounters(t *testing.T) {
	now := time.Now()
	s, _ := budgetEntry(now, 0, 0)
	fill := func(lastUse time.Time) {
		clear(s.entries)
		for i := range maxEntries {
			c := limit.Check{Key: fmt.Sprint("k", i), Limit: 100, WindowUS: 60e6}
			s.entries[c.Key] = &entry{check: c, avail: 1, lastUse: lastUse}
		}
	}
	fresh := limit.Check{Key: "new", Limit: 100, WindowUS: 60e6, Hits: 1, Global: true}
	fill(now.Add(-2 * evictAfter))
	if e := s.entry(&fresh, now); e == nil || len(s.entries) != maxEntries {
		t.Errorf("a new key, the store full of counters unasked for %v: entry %v, %d counters; want one forgotten for it", 2*evictAfter, e, len(s.entries))
	}
	fill(now)
	if e := s.entry(&fresh, now); e != nil || len(s.entries) != maxEntries {
		t.Errorf("a new key, the store full of counters asked just now: entry %v, %d counters; want it refused, none forgotten", e, len(s.entries))
	}
}

// TestStreamsCarriedIntoTheNextWindow: streams admitted late in a window
// charge in the next, so the next window's first draw asks for what they
// held and holds it again from its hits; a check of the new window is
// admitted only on what is left (a budget at 3× offered spent 1.04-1.05×
// its budget in a window without it).
func TestStreamsCarriedIntoTheNextWindow(t *testing.T) {
	now := time.Now()
	s, e := budgetEntry(now, 0, 10_000)
	e.check.Limit = 100_000 // a draw's fair share (a quarter of it) is no bound here
	e.flights = []flight{{at: now, hits: 1000, gen: e.gen, end: e.windowEnd}, {at: now, hits: 1000, gen: e.gen, end: e.windowEnd}}
	// The window ends: its hits are void; the two streams still run.
	later := e.resetAt.Add(10 * time.Millisecond)
	s.now = func() time.Time { return later }
	if got := e.carrying(later); got != 2000 {
		t.Fatalf("two streams of 1,000 running past their window's end: carrying %d, want 2000", got)
	}
	n := s.drawSize(e, later, s.opts.Refresh)
	if n < 2000+2*e.estimate() {
		t.Errorf("the new window's first draw asks %d, want at least the 2,000 carried and two streams' estimate", n)
	}
	// It lands with 2,500: 2,000 hold the streams carried, 500 are left.
	s.granted(e, n, limit.GrantResult{Hits: 2500, Remaining: 97_500, ResetUS: 3600e6, WindowEndUS: e.windowEnd + 3600e6}, later)
	if e.avail != 500 || e.carrying(later) != 0 {
		t.Fatalf("after the draw: held %d, carrying %d; want 500 held, nothing left to carry", e.avail, e.carrying(later))
	}
	// A carried stream's charge is paid from what it holds again.
	if _, owed := s.spend(e, 900, later); owed || e.avail != 600 {
		t.Errorf("a carried stream charging 900 of its 1,000: owed %v, held %d; want nothing owed, 600 held", owed, e.avail)
	}
}

// TestHoldsAboveTheMean: a stream holds its estimate and half the
// charges' deviation, so that an instance's charges beyond their holds
// are paid by those below (held at the mean, its debts drift up and are
// settled past a spent budget); charges all alike hold the mean.
func TestHoldsAboveTheMean(t *testing.T) {
	now := time.Now()
	_, e := budgetEntry(now, 0, 10_000)
	e.perCheck, e.charges = 0, 0
	for i := range 200 {
		e.land(uint64(500+1000*(i%2)), true) // 500, 1,500: mean 1,000, deviation 500
	}
	if h := e.hold(); h < 1200 || h > 1300 {
		t.Errorf("charges of 500 and 1,500: hold %d, want about 1,250", h)
	}
	_, e = budgetEntry(now, 0, 10_000)
	e.perCheck, e.charges = 0, 0
	for range 50 {
		e.land(700, true)
	}
	if h := e.hold(); h != 700 {
		t.Errorf("charges all of 700: hold %d, want 700", h)
	}
}

// TestColdStreamsBounded: before any charge has taught what a stream
// spends, at most limit.ColdInFlight streams are in flight at an
// instance (a region's budget counts each as a quarter of its limit),
// each for limit.ColdFlightMS at most; a request that costs its hit is
// not held to it.
func TestColdStreamsBounded(t *testing.T) {
	now := time.Now()
	s, e := budgetEntry(now, 5000, 10_000)
	e.perCheck, e.charges = 0, 0
	check := func(c limit.Check) bool {
		p := plan{now: s.now(), results: make([]limit.Result, 1)}
		s.budgetCheck(&p, 0, &c, e, true)
		if !p.refused {
			s.mu.Unlock() // fly takes mu
			s.fly(&p)
			s.mu.Lock()
		}
		return !p.refused
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for i := range limit.ColdInFlight {
		if !check(e.check) {
			t.Fatalf("stream %d before any charge: refused, want admitted", i+1)
		}
	}
	if check(e.check) {
		t.Errorf("stream %d before any charge: admitted, want refused", limit.ColdInFlight+1)
	}
	cost := e.check
	cost.Hits, cost.Kind = 1, limit.CostCheck
	if !check(cost) {
		t.Errorf("a request costing 1 before any charge: refused, want admitted")
	}
	later := now.Add(limit.ColdFlightMS*time.Millisecond + time.Millisecond)
	s.now = func() time.Time { return later }
	e.expireFlights(later, flightTimeout(e.check.FlightS))
	if !check(e.check) {
		t.Errorf("a stream once the cold streams' %d ms passed: refused, want admitted", limit.ColdFlightMS)
	}
}

// TestHeldHitsVoidAfterTheirWindow: hits held from a grant whose window
// has ended, on this clock, are not spent by a request in the moments
// before the background pass drops them: the next window's grants are
// the limit's whole, and spending the last window's too would put the
// regions together over it.
func TestHeldHitsVoidAfterTheirWindow(t *testing.T) {
	now := time.Now()
	s, e := budgetEntry(now, 10, 1000)
	e.usage = false
	e.check.Usage = false
	e.validTill = now.Add(-time.Millisecond) // the window ended a moment ago
	c := e.check
	c.Hits, c.Global = 1, true
	p := plan{now: now, results: make([]limit.Result, 1)}
	s.reserve(&p, []limit.Check{c}, 0)
	if e.avail != 10 || !p.results[0].Over {
		t.Errorf("a request after its grant's window ended: held %d (of 10), answer %+v; want nothing spent, refused", e.avail, p.results[0])
	}
	// Within the window, the same request is admitted from what is held.
	e.validTill = now.Add(time.Minute)
	p = plan{now: now, results: make([]limit.Result, 1)}
	s.reserve(&p, []limit.Check{c}, 0)
	if e.avail != 9 || p.results[0].Over {
		t.Errorf("a request within its grant's window: held %d (of 10), answer %+v; want 9 left, admitted", e.avail, p.results[0])
	}
}

// TestGrantKeptWhileAskedEveryFewSeconds: a counter's grant is given back
// only once it has gone unasked for 5 s (or four refreshes, if longer): a
// key asked every second or two keeps what it holds and its measured
// demand, and is not made to wait for a draw again.
func TestGrantKeptWhileAskedEveryFewSeconds(t *testing.T) {
	for _, tt := range []struct {
		refresh, unasked time.Duration
		givenBack        bool
	}{
		{250 * time.Millisecond, 4900 * time.Millisecond, false},
		{250 * time.Millisecond, 5100 * time.Millisecond, true},
		{2 * time.Second, 7900 * time.Millisecond, false},
		{2 * time.Second, 8100 * time.Millisecond, true},
	} {
		now := time.Now()
		s, e := budgetEntry(now, 10, 1000)
		s.opts.Refresh = tt.refresh
		e.usage, e.check.Usage = false, false
		e.lastUse = now.Add(-tt.unasked)
		ops, _ := s.passOps(now, false)
		back := slices.ContainsFunc(ops, func(op limit.GrantOp) bool { return op.GiveBack })
		if back != tt.givenBack {
			t.Errorf("refresh %v, unasked %v: given back %v, want %v", tt.refresh, tt.unasked, back, tt.givenBack)
		}
	}
}
