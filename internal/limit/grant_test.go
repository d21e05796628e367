package limit

import (
	"math/rand/v2"
	"testing"
)

// TestGrantNeverExceeds: whatever grants are asked for, by however many
// holders, the hits granted in a window (or held by a bucket) never pass
// the limit, and a request decided after them sees them consumed.
func TestGrantNeverExceeds(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for _, c := range []Check{
		{Limit: 100, WindowUS: 60e6},
		{Limit: 100, WindowUS: 60e6, Algorithm: SlidingWindow},
		{Limit: 100, WindowUS: 60e6, Algorithm: TokenBucket},
		{Limit: 100, WindowUS: 60e6, Algorithm: TokenBucket, Burst: 10},
	} {
		var st State
		found := false
		now := int64(1_700_000_000_000_000)
		end := WindowEnd(now, c.WindowUS)
		granted := uint64(0)
		for range 500 {
			n := uint64(rng.IntN(30))
			if rng.IntN(10) == 0 {
				n = 1 << 40 // saturates
			}
			granted += Grant(&c, &st, found, now, n)
			found = true
		}
		limit := c.Limit
		if c.Algorithm == TokenBucket && c.Burst > 0 {
			limit = c.Burst
		}
		if granted != limit {
			t.Errorf("%v: %d granted at one instant, want exactly %d", c.Algorithm, granted, limit)
		}
		// A request now is over: the grants consumed the budget.
		res, exp := make([]Result, 1), make([]int64, 1)
		req := c
		req.Hits = 1
		if Decide([]Check{req}, []State{st}, []bool{true}, now, res, exp); !res[0].Over {
			t.Errorf("%v: a request after the grants is not over: %+v", c.Algorithm, res[0])
		}
		// Giving 30 back makes room for 30 again in the same window (a
		// bucket holds at most its burst).
		if n := GiveBack(&c, &st, true, now, end, 30); n != 30 {
			t.Fatalf("%v: %d given back in the grant's window, want 30", c.Algorithm, n)
		}
		if g, want := Grant(&c, &st, true, now, 50), min(30, limit); g != want {
			t.Errorf("%v: %d granted after giving 30 back, want %d", c.Algorithm, g, want)
		}
	}
}

// TestGiveBackOnlyInItsWindow: hits of a grant taken in one window never
// lower the next window's count.
func TestGiveBackOnlyInItsWindow(t *testing.T) {
	c := Check{Limit: 10, WindowUS: 1e6}
	now := int64(5_000_000_100)
	end := WindowEnd(now, c.WindowUS)
	var st State
	if g := Grant(&c, &st, false, now, 10); g != 10 {
		t.Fatalf("granted %d", g)
	}
	next := end + 10
	if g := Grant(&c, &st, true, next, 4); g != 4 {
		t.Fatalf("next window granted %d, want 4", g)
	}
	if n := GiveBack(&c, &st, true, next, end, 10); n != 0 {
		t.Errorf("%d of the old window's unused hits given back into the next window", n)
	}
	if st.Count != 4 {
		t.Errorf("next window's count %d, want 4", st.Count)
	}
}
