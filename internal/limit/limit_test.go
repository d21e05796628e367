package limit

import "testing"

func decide(t *testing.T, checks []Check, states []State, found []bool, now int64) ([]Result, bool) {
	t.Helper()
	res := make([]Result, len(checks))
	exp := make([]int64, len(checks))
	ok := Decide(checks, states, found, now, res, exp)
	for i := range found {
		found[i] = exp[i] != 0
	}
	return res, ok
}

func TestApplyAllOrNothing(t *testing.T) {
	checks := []Check{
		{Key: "a", Limit: 10, WindowUS: 60e6, Hits: 1},
		{Key: "b", Limit: 2, WindowUS: 60e6, Hits: 1},
		{Key: "c", Limit: 5, WindowUS: 60e6, Hits: 3, Refund: true},
	}
	now := int64(30e6)
	states := []State{{End: 60e6, Count: 4}, {End: 60e6, Count: 2}, {End: 60e6, Count: 1}}
	found := []bool{true, true, true}
	res, ok := decide(t, checks, states, found, now)
	if ok {
		t.Fatal("admitted, want rejected by b")
	}
	if states[0].Count != 4 || states[1].Count != 2 || states[2].Count != 0 {
		t.Errorf("counts = %v, want 4 2 0: no consumption, refund floored at 0", states)
	}
	if res[0].Over || !res[1].Over || res[2].Over || res[0].Remaining != 6 || res[1].ResetUS != 30e6 {
		t.Errorf("results = %+v", res)
	}
	checks[1].NoVeto = true
	states = []State{{End: 60e6, Count: 4}, {End: 60e6, Count: 2}, {End: 60e6, Count: 4}}
	found = []bool{true, true, true}
	if _, ok := decide(t, checks, states, found, now); !ok {
		t.Fatal("rejected by a shadow counter")
	}
	if states[0].Count != 5 || states[1].Count != 2 || states[2].Count != 1 {
		t.Errorf("counts = %v, want 5 2 1", states)
	}
}

func TestPeekAndStaleWindow(t *testing.T) {
	c := []Check{{Limit: 3, WindowUS: 1e6}}
	st := []State{{End: 2e6, Count: 3}}
	res, ok := decide(t, c, st, []bool{true}, 1.5e6)
	if !ok || res[0].Over || st[0].Count != 3 {
		t.Errorf("peek at the limit: %+v %v", res, st)
	}
	// A state of another window counts 0.
	c[0].Hits = 1
	res, _ = decide(t, c, st, []bool{true}, 5.5e6)
	if res[0].Over || st[0].Count != 1 || st[0].End != 6e6 {
		t.Errorf("stale window: %+v %+v", res, st)
	}
}

// TestSlidingWindowTimeline: 10 per 10 s. 10 hits late in window [0,10 s)
// still weigh on the next window, less as it slides.
func TestSlidingWindowTimeline(t *testing.T) {
	c := []Check{{Limit: 10, WindowUS: 10e6, Algorithm: SlidingWindow, Hits: 10}}
	st, found := []State{{}}, []bool{false}
	if res, ok := decide(t, c, st, found, 9e6); !ok || res[0].Remaining != 0 {
		t.Fatalf("10 at 9 s: %+v", res)
	}
	c[0].Hits = 1
	res, _ := decide(t, c, st, found, 10e6)
	if !res[0].Over {
		t.Errorf("at 10 s: %+v, want over (the previous window's 10 count fully)", res[0])
	}
	res, _ = decide(t, c, st, found, 12e6)
	if res[0].Over || res[0].Remaining != 1 {
		t.Errorf("at 12 s: %+v, want OK with remaining 10 - (8 + 1) = 1", res[0])
	}
	res, _ = decide(t, c, st, found, 12e6)
	if res[0].Over || res[0].Remaining != 0 {
		t.Errorf("again at 12 s: %+v, want OK, remaining 0", res[0])
	}
	res, _ = decide(t, c, st, found, 12e6)
	if !res[0].Over {
		t.Errorf("third at 12 s: %+v, want over", res[0])
	}
	res, _ = decide(t, c, st, found, 25e6)
	if res[0].Over || st[0].Prev != 2 || res[0].Remaining != 8 {
		t.Errorf("next window, half way: %+v %+v, want prev 2 weighing 1: 10 - (1 + 1) = 8", res[0], st[0])
	}
	res, _ = decide(t, c, st, found, 45e6)
	if res[0].Over || st[0].Prev != 0 || st[0].Count != 1 {
		t.Errorf("two windows later: %+v %+v, want a fresh count", res[0], st[0])
	}
}

// TestTokenBucketTimeline: 10 per second (one token each 100 ms), burst 5.
func TestTokenBucketTimeline(t *testing.T) {
	c := []Check{{Limit: 10, WindowUS: 1e6, Algorithm: TokenBucket, Burst: 5, Hits: 1}}
	st, found := []State{{}}, []bool{false}
	now := int64(1000e6)
	for i := range 5 {
		res, ok := decide(t, c, st, found, now)
		if !ok || res[0].Remaining != uint64(4-i) {
			t.Fatalf("burst hit %d: %+v", i, res[0])
		}
	}
	res, ok := decide(t, c, st, found, now)
	if ok || res[0].ResetUS != 100e3 {
		t.Fatalf("6th at once: %+v, want over, next in 100 ms", res[0])
	}
	res, ok = decide(t, c, st, found, now+100e3)
	if !ok || res[0].Remaining != 0 {
		t.Fatalf("after 100 ms: %+v, want one allowed", res[0])
	}
	// A refund of 2 gives two tokens back; never more than the burst.
	c[0].Refund, c[0].Hits = true, 2
	res, _ = decide(t, c, st, found, now+100e3)
	if res[0].Remaining != 2 {
		t.Fatalf("after refund 2: %+v", res[0])
	}
	c[0].Hits = 100
	res, _ = decide(t, c, st, found, now+100e3)
	if res[0].Remaining != 5 || found[0] {
		t.Fatalf("after a huge refund: %+v, key kept %v; want a full bucket and no key", res[0], found[0])
	}
	// hits_addend larger than the burst never fits.
	c[0].Refund, c[0].Hits = false, 6
	if _, ok := decide(t, c, st, found, now+10e6); ok {
		t.Error("6 hits admitted by a bucket of 5")
	}
}

func TestWindowEnd(t *testing.T) {
	if got := WindowEnd(61e6+5, 60e6); got != 120e6 {
		t.Errorf("WindowEnd = %d", got)
	}
	if got := WindowEnd(60e6, 60e6); got != 120e6 {
		t.Errorf("WindowEnd at boundary = %d", got)
	}
}
