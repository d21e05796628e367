package limit

import (
	"fmt"
	"testing"
)

// TestUsageCharged is the token budget's sequence: a charge that crosses
// the limit is recorded, and every later budget check is over until the
// window ends; a request (no Usage) refused beside it consumes nothing.
func TestUsageCharged(t *testing.T) {
	const hour = 3600e6
	st, found := []State{{}}, []bool{false}
	now := int64(10e6)
	step := func(hits uint64, wantOver bool, wantRemaining uint64) {
		t.Helper()
		c := []Check{{Key: "k", Limit: 1000, WindowUS: hour, Hits: hits, Usage: true, FlightS: 60}}
		res, _ := decide(t, c, st, found, now)
		if res[0].Over != wantOver || res[0].Remaining != wantRemaining {
			t.Fatalf("hits %d: %+v, want over %v, remaining %d (state %+v)", hits, res[0], wantOver, wantRemaining, st[0])
		}
	}
	step(0, false, 1000)
	step(900, false, 100)
	step(500, true, 0)
	if st[0].Count != 1400 {
		t.Fatalf("count %d, want 1400: the crossing charge recorded", st[0].Count)
	}
	step(0, true, 0)
	step(500, true, 0)
	step(0, true, 0)
	// A request stating no hits (no Usage) refused beside a spent budget
	// consumes nothing; a usage charge beside it is recorded.
	checks := []Check{
		{Key: "spent", Limit: 1000, WindowUS: hour, Hits: 10, Usage: true},
		{Key: "tenant", Limit: 1e6, WindowUS: hour, Hits: 10, Usage: true},
		{Key: "requests", Limit: 100, WindowUS: hour, Hits: 1},
	}
	states := []State{{End: hour, Count: 1000}, {End: hour, Count: 5}, {End: hour, Count: 7}}
	if _, ok := decide(t, checks, states, []bool{true, true, true}, now); ok {
		t.Fatal("admitted with a spent budget")
	}
	if states[0].Count != 1010 || states[1].Count != 15 || states[2].Count != 7 {
		t.Fatalf("counts %d %d %d, want 1010 15 7", states[0].Count, states[1].Count, states[2].Count)
	}
	// The next window starts afresh.
	now = hour + 1
	step(0, false, 1000)
}

// budget is one counter's sequence of usage calls at a scripted clock
// (µs), for the tests below.
type budget struct {
	t     *testing.T
	c     Check
	st    []State
	found []bool
	now   int64
}

func newBudget(t *testing.T, limit uint64) *budget {
	return &budget{t: t, c: Check{Key: "k", Limit: limit, WindowUS: 3600e6, Usage: true, FlightS: 300},
		st: []State{{}}, found: []bool{false}, now: 5e6}
}

func (b *budget) call(kind UsageKind, hits uint64) Result {
	b.t.Helper()
	c := []Check{b.c}
	c[0].Kind, c[0].Hits = kind, hits
	res, _ := decide(b.t, c, b.st, b.found, b.now)
	return res[0]
}

// stream is one stream that charges: an admitted check, ms later a charge.
func (b *budget) stream(ms int64, hits uint64) {
	b.t.Helper()
	b.mustAdmit("check")
	b.ms(ms)
	b.charge(hits)
}

func (b *budget) check() Result          { b.t.Helper(); return b.call(ByHits, 0) }
func (b *budget) charge(h uint64) Result { b.t.Helper(); return b.call(ByHits, h) }
func (b *budget) ms(d int64)             { b.now += d * 1000 }
func (b *budget) state() *State          { return &b.st[0] }
func (b *budget) horizonMS() int64       { return FlightMS(&b.c, b.state()) }
func (b *budget) mustAdmit(what string)  { b.t.Helper(); b.want(what, false) }
func (b *budget) mustRefuse(what string) { b.t.Helper(); b.want(what, true) }
func (b *budget) want(what string, over bool) {
	b.t.Helper()
	if r := b.check(); r.Over != over {
		b.t.Fatalf("%s: over %v, want %v (state %+v)", what, r.Over, over, *b.state())
	}
}

// TestBudgetChecksInFlight: a budget check is admitted while the checks
// in flight, at the usage per check seen, leave something of the budget;
// a charge ends one; an uncharged one expires.
func TestBudgetChecksInFlight(t *testing.T) {
	b := newBudget(t, 10_000)
	for range 3 {
		b.mustAdmit("first checks")
		b.ms(10)
		b.charge(1000)
	}
	if st := b.state(); st.Avg != 1000*AvgScale || st.Charges != 3 || st.InFlight() != 0 || st.Count != 3000 {
		t.Fatalf("state %+v, want avg 1000 of 3 charges, none in flight, count 3000", *st)
	}
	// 7000 left: checks are admitted while 3000 + n x 1000 x (3+3)/(3+1)
	// < 10,000 (the mean of three charges widened), so the sixth (five in
	// flight) is refused.
	for i := range 5 {
		b.mustAdmit(fmt.Sprintf("check %d", i+1))
	}
	r := b.check()
	if !r.Over || r.Remaining != 7000 {
		t.Fatalf("sixth check: %+v, want over with 7000 remaining (the count, not the flights)", r)
	}
	// Its retry is when the oldest flight expires, not the hour's end.
	if want := (b.horizonMS()+1)*1000 + (b.now/1000)*1000 - b.now; r.ResetUS > want || r.ResetUS <= 0 {
		t.Fatalf("reset %d us, want when the oldest flight expires (%d us)", r.ResetUS, want)
	}
	// A charge smaller than the average frees room for one more: the
	// mean of the four charges is 850 (1190 widened).
	b.charge(400)
	if st := b.state(); st.InFlight() != 4 || st.Avg != 850*AvgScale {
		t.Fatalf("after a charge: %d in flight, avg %d; want 4 and 850", st.InFlight(), st.Avg/AvgScale)
	}
	b.mustAdmit("check after a charge freed room")
	// Checks whose charge never comes expire after the horizon: twice
	// the streams' duration, at least MinFlightMS.
	if h := b.horizonMS(); h != MinFlightMS {
		t.Fatalf("horizon %d ms, want %d (streams of 10 ms)", h, MinFlightMS)
	}
	b.ms(MinFlightMS)
	if b.check(); b.state().InFlight() != 6 {
		t.Fatalf("%d in flight at the horizon, want all 5 kept and this one", b.state().InFlight())
	}
	b.ms(1)
	if r := b.check(); r.Over || b.state().InFlight() != 2 {
		t.Fatalf("after the horizon: %+v, %d in flight; want admitted, 2 (the last one and this)", r, b.state().InFlight())
	}
	// The average serves the next window, not the one after.
	b.now = 3600e6 + 1
	b.check()
	if st := b.state(); st.Avg != 850*AvgScale || st.Charges != 4 || st.DurMS == 0 {
		t.Fatalf("next window: avg %d of %d, duration %d; want 850 of 4 and the duration kept", st.Avg/AvgScale, st.Charges, st.DurMS)
	}
	b.now = 3*3600e6 + 1
	b.check()
	if st := b.state(); st.Avg != 0 || st.Charges != 0 || st.DurMS != 0 {
		t.Fatalf("two windows on: avg %d, duration %d, want 0", st.Avg, st.DurMS)
	}
}

// TestUnchargedChecksReleased: a budget of 10,000, a check, a charge of
// 2,500, then checks whose charge never comes: they hold the rest only
// until the horizon, never the window. (Two fit: one charge is widened
// to 5,000 a check.)
func TestUnchargedChecksReleased(t *testing.T) {
	b := newBudget(t, 10_000)
	b.stream(200, 2500)
	b.mustAdmit("uncharged check")
	b.ms(20) // in the same bucket of flights (a sixteenth of the horizon)
	b.mustAdmit("uncharged check")
	r := b.check()
	if !r.Over || r.Remaining != 7500 || r.ResetUS > 1e6 {
		t.Fatalf("third check: %+v, want over, 7500 remaining, retry within a second", r)
	}
	if h := b.horizonMS(); h != 400 {
		t.Fatalf("horizon %d ms, want 400: twice the 200 ms the stream lasted", h)
	}
	// Never early: the first check is past the horizon, the second (in
	// its bucket) is not.
	b.ms(381)
	b.mustRefuse("check 401 ms after the first uncharged check, 381 ms after the second")
	b.ms(20)
	b.mustAdmit("check after the horizon")
}

// TestNoSelfLock: after one charge larger than what is left, the rest of
// the budget stays usable.
func TestNoSelfLock(t *testing.T) {
	b := newBudget(t, 1_000_000)
	b.stream(100, 600_000)
	b.mustAdmit("check with 400,000 left after a charge of 600,000")
	b.ms(100)
	b.charge(300_000)
	b.mustAdmit("check with 100,000 left")
	b.ms(100)
	b.charge(150_000)
	if r := b.check(); !r.Over || r.Remaining != 0 {
		t.Fatalf("spent budget: %+v, want over", r)
	}
}

// TestColdStart: before any charge tells the usage per check, at most
// ColdInFlight checks are in flight; an exactly spent budget, or a limit
// of 0, admits none.
func TestColdStart(t *testing.T) {
	b := newBudget(t, 100_000)
	for i := range ColdInFlight {
		b.mustAdmit(fmt.Sprintf("cold check %d", i+1))
	}
	b.mustRefuse("a check past the cold quota")
	b.ms(20)
	b.charge(1000)
	b.mustAdmit("check after the first charge")
	b.ms(ColdFlightMS) // long past the learned horizon
	for range 50 {
		b.mustAdmit("checks at the learned usage")
	}
	for _, lim := range []uint64{0, 100} {
		z := newBudget(t, lim)
		if lim > 0 {
			z.charge(lim)
		}
		z.mustRefuse(fmt.Sprintf("a check on a spent budget of %d", lim))
	}
}

// TestZeroCharge: a stream end that charged nothing ends a flight and
// pulls the usage per check toward 0, where a plain check would add one.
func TestZeroCharge(t *testing.T) {
	b := newBudget(t, 10_000)
	b.stream(50, 1000)
	b.mustAdmit("check")
	b.ms(50)
	b.call(ZeroCharge, 0)
	if st := b.state(); st.InFlight() != 0 || st.Charges != 2 || st.Avg != 500*AvgScale || st.Count != 1000 {
		t.Fatalf("after a zero charge: %+v, want none in flight, avg 500 of 2, count 1000", *st)
	}
	// With none in flight a zero charge still counts toward the usage.
	b.call(ZeroCharge, 0)
	if st := b.state(); st.Charges != 3 || st.Avg != 500*AvgScale-500*AvgScale/3 {
		t.Fatalf("an unpaired zero charge: avg %d/1024 of %d, want 1000/3", st.Avg, st.Charges)
	}
}

// TestCostChecks: a request-phase call that costs its hits (a stated 1,
// or none) is a plain request on a counter never charged, and a budget
// check that consumes its cost and joins the flights on a budget;
// refused, it consumes nothing.
func TestCostChecks(t *testing.T) {
	b := newBudget(t, 26_000)
	// Never charged: plain requests, whatever else is in flight.
	b.check()
	for range 5 {
		b.call(CostCheck, 1)
	}
	if st := b.state(); st.Count != 5 || st.InFlight() != 1 || st.Charges != 0 {
		t.Fatalf("cost calls on a counter never charged: %+v, want count 5, the one cold check in flight", *st)
	}
	b.ms(100)
	b.charge(2994)
	for i := range 4 {
		if r := b.call(CostCheck, 1); r.Over {
			t.Fatalf("cost check %d refused", i+1)
		}
	}
	if st := b.state(); st.Count != 3003 || st.InFlight() != 4 {
		t.Fatalf("after four cost checks: %+v, want count 3003, 4 in flight", *st)
	}
	// 3003 + 4 x 2994 x 2 (one charge, widened) >= 26,000: refused, and
	// nothing consumed.
	if r := b.call(CostCheck, 1); !r.Over || b.state().Count != 3003 || b.state().InFlight() != 4 {
		t.Fatalf("cost check past the flights: %+v, state %+v; want over, nothing consumed", r, *b.state())
	}
	// A cost that does not fit is over whatever is in flight.
	c := newBudget(t, 10)
	if r := c.call(CostCheck, 11); !r.Over || c.state().Count != 0 {
		t.Fatalf("cost past the limit: %+v", r)
	}
}

// TestPlainUntilCharged: on a counter no charge was ever recorded on,
// a call that costs 1 is a plain request however many come at once: a
// fresh counter of 20 admits exactly 20, each answered with the window's
// remaining count and reset.
func TestPlainUntilCharged(t *testing.T) {
	b := newBudget(t, 20)
	for i := range 20 {
		r := b.call(CostCheck, 1)
		if r.Over || r.Remaining != uint64(19-i) || r.ResetUS != 3600e6-5e6 {
			t.Fatalf("request %d: %+v, want admitted, %d left, the window's reset", i+1, r, 19-i)
		}
	}
	if r := b.call(CostCheck, 1); !r.Over || r.Remaining != 0 || b.state().Count != 20 {
		t.Fatalf("request 21: %+v, count %d; want over, 20 counted", r, b.state().Count)
	}
	if st := b.state(); st.InFlight() != 0 || st.Charges != 0 {
		t.Fatalf("plain requests left a budget's state: %+v", *st)
	}
}

// TestPlainCharge: a charge that is never a budget's (--budgets off) is
// recorded when it crosses the limit, as any charge, and leaves no
// budget's state: the counter stays plain.
func TestPlainCharge(t *testing.T) {
	b := newBudget(t, 10)
	b.check()
	b.ms(100)
	for i, over := range []bool{false, false, true} {
		if r := b.call(PlainCharge, 4); r.Over != over {
			t.Fatalf("plain charge %d: %+v, want over %v", i+1, r, over)
		}
	}
	if st := b.state(); st.Count != 12 || st.Charges != 0 || st.InFlight() != 1 {
		t.Fatalf("after plain charges: %+v, want count 12, no charge learned, the check still in flight", *st)
	}
}

// TestGiveBackLeavesFlight: a budget check admitted, then given back
// because another hash slot refused its request (EvaluateInOrder), leaves
// the flights as they were before it: a cost check on a budget, a check
// stating 0 on an uncosted budget and the cold start's check; a 0 on a
// costed budget was a stream's end and gives back no flight.
func TestGiveBackLeavesFlight(t *testing.T) {
	const now = int64(1_800_000_000_000_000)
	base := Check{Key: "b", Limit: 1000, WindowUS: 3600e6, Usage: true, FlightS: 60}
	charged := func(costed bool) State {
		st := State{End: WindowEnd(now, base.WindowUS), Count: 100, Avg: 10 * AvgScale, Charges: 5, DurMS: 500, Costed: costed,
			Flights: []Flight{{FirstMS: now/1000 - 100, LastMS: now/1000 - 100, N: 2}}}
		return st
	}
	tests := []struct {
		name  string
		check Check
		state State
		found bool
	}{
		{"a cost check on a budget", Check{Hits: 1, Kind: CostCheck}, charged(false), true},
		{"a check stating 0 on a budget", Check{}, charged(false), true},
		{"the cold start's check", Check{}, State{}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := base
			c.Hits, c.Kind = tt.check.Hits, tt.check.Kind
			states, found := []State{tt.state}, []bool{tt.found}
			before := states[0].InFlight()
			if _, ok := decide(t, []Check{c}, states, found, now); !ok {
				t.Fatal("refused")
			}
			if states[0].InFlight() != before+1 {
				t.Fatalf("%d in flight after the check, want %d", states[0].InFlight(), before+1)
			}
			back := c
			back.Refund = true
			decide(t, []Check{back}, states, found, now+1000)
			if states[0].InFlight() != before {
				t.Errorf("%d in flight after the give-back, want %d", states[0].InFlight(), before)
			}
		})
	}
	t.Run("a stream end of 0 on a costed budget", func(t *testing.T) {
		states, found := []State{charged(true)}, []bool{true}
		decide(t, []Check{base}, states, found, now)
		if n := states[0].InFlight(); n != 1 {
			t.Fatalf("%d in flight after the stream end, want 1 (it ended one)", n)
		}
		back := base
		back.Refund = true
		decide(t, []Check{back}, states, found, now+1000)
		if n := states[0].InFlight(); n != 1 {
			t.Errorf("%d in flight after giving back a stream end, want 1", n)
		}
	})
}

// TestPairedFlightsShortenOnceLearned: a paired counter's checks stay in
// flight twice the learned stream duration, as an unpaired one's, until
// AvgCharges pairs have ended (its first charges are its shortest
// streams); only then 1.25 times the longest stream's own.
func TestPairedFlightsShortenOnceLearned(t *testing.T) {
	c := Check{Key: "b", Limit: 1000, WindowUS: 3600e6, Usage: true, FlightS: 300, PairID: "r1"}
	for _, tt := range []struct {
		charges uint64
		pair    string
		want    int64
	}{
		{1, "r1", 2000},
		{AvgCharges - 1, "r1", 2000},
		{AvgCharges, "r1", 1250},
		{AvgCharges, "", 2000},
	} {
		c.PairID = tt.pair
		st := &State{DurMS: 1000, Charges: tt.charges}
		if got := FlightMS(&c, st); got != tt.want {
			t.Errorf("paired %q, %d charges, streams of 1 s: in flight %d ms, want %d", tt.pair, tt.charges, got, tt.want)
		}
	}
}
