package global

import (
	"fmt"
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
