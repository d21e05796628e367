package limit

import "testing"

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

// TestBudgetChecksInFlight: a budget check is admitted only while the
// checks in flight, at the usage per check seen, fit in what is left; a
// charge ends one; unanswered ones expire after FlightS.
func TestBudgetChecksInFlight(t *testing.T) {
	const hour = 3600e6
	st, found := []State{{}}, []bool{false}
	now := int64(5e6)
	call := func(hits uint64) Result {
		t.Helper()
		c := []Check{{Key: "k", Limit: 10_000, WindowUS: hour, Hits: hits, Usage: true, FlightS: 60}}
		res, _ := decide(t, c, st, found, now)
		return res[0]
	}
	// No usage seen yet: checks are admitted while anything is left.
	for range 3 {
		if r := call(0); r.Over {
			t.Fatal("first checks refused")
		}
	}
	for range 3 {
		call(1000)
	}
	if st[0].Avg != 1000*AvgScale || st[0].Charges != 3 || st[0].InFlight() != 0 || st[0].Count != 3000 {
		t.Fatalf("state %+v, want avg 1000 of 3 charges, none in flight, count 3000", st[0])
	}
	// 7000 left: seven checks of 1000 fit, the eighth does not.
	for i := range 7 {
		if r := call(0); r.Over {
			t.Fatalf("check %d refused with %d in flight", i+1, st[0].InFlight())
		}
	}
	if r := call(0); !r.Over || r.Remaining != 7000 {
		t.Fatalf("eighth check: %+v, want over with 7000 remaining (the count, not the flights)", r)
	}
	// A charge smaller than the average frees room for one more: the
	// mean of the four charges is 850.
	call(400)
	if st[0].InFlight() != 6 || st[0].Avg != 850*AvgScale {
		t.Fatalf("after a charge: %d in flight, avg %d; want 6 and 850", st[0].InFlight(), st[0].Avg/AvgScale)
	}
	if r := call(0); r.Over {
		t.Fatal("check refused after a charge freed room")
	}
	// Charges that never come expire: after FlightS nothing is in flight.
	now += (60 + (60+flightBuckets-1)/flightBuckets + 1) * 1e6 // FlightS and one expiry bucket
	if r := call(0); r.Over || st[0].InFlight() != 1 {
		t.Fatalf("after expiry: %+v, %d in flight; want admitted, 1 in flight", r, st[0].InFlight())
	}
	// The average serves the next window, not the one after.
	now = hour + 1
	call(0)
	if st[0].Avg != 850*AvgScale || st[0].Charges != 4 {
		t.Fatalf("next window: avg %d of %d, want 850 of 4 kept", st[0].Avg/AvgScale, st[0].Charges)
	}
	now = 3*hour + 1
	call(0)
	if st[0].Avg != 0 || st[0].Charges != 0 {
		t.Fatalf("two windows on: avg %d, want 0", st[0].Avg)
	}
}

// TestUsageFlightsNotShared: a stored state's flights are never written
// through, since a store may hand the same slice to two decisions.
func TestUsageFlightsNotShared(t *testing.T) {
	base := State{End: 60e6, Count: 1, Avg: 5 * AvgScale, Charges: 1, Flights: []Flight{{Exp: 100, N: 2}}}
	base.Flights = append(base.Flights, Flight{Exp: 120, N: 1})[:1:2]
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
		fly(&c, &st, 1, 0)
		fly(&c, &st, 1, uint64(1000+2000*(i%2)))
	}
	if st.Charges != AvgCharges || st.Avg < 1990*AvgScale || st.Avg > 2010*AvgScale {
		t.Fatalf("mean %v of %d charges, want 2000 of %d", float64(st.Avg)/AvgScale, st.Charges, AvgCharges)
	}
	for range 4 * AvgCharges {
		fly(&c, &st, 1, 0)
		fly(&c, &st, 1, 10)
	}
	if st.Avg > 50*AvgScale {
		t.Fatalf("mean %v after usage fell to 10, want it followed", float64(st.Avg)/AvgScale)
	}
}
