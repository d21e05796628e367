package redisstore_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/internal/limit"
	"github.com/ratelimitd/ratelimitd/internal/redisstore"
	"github.com/ratelimitd/ratelimitd/internal/redisstore/redistest"
)

// TestSettleCountedOnce: a settle is counted once per settler and seq,
// however often it is sent (a retry of one whose answer was lost), in
// the window it names only; and it is recorded past the limit, as a
// usage charge is; and a window late at most.
func TestSettleCountedOnce(t *testing.T) {
	srv := redistest.Start(t)
	s := newStore(t, srv, nil)
	ctx := context.Background()
	c := limit.Check{Key: "settled", Limit: 100, WindowUS: 3600e6}
	took, err := s.Grant(ctx, []limit.GrantOp{{Check: hitsOf(c, 30)}})
	if err != nil || took[0].Hits != 30 {
		t.Fatalf("take: %+v, %v", took, err)
	}
	end := took[0].WindowEndUS
	settle := func(settler string, seq, n uint64, windowEnd int64) limit.GrantResult {
		t.Helper()
		r, err := s.Grant(ctx, []limit.GrantOp{{Check: hitsOf(c, n), Settle: true, Settler: settler, Seq: seq, WindowEndUS: windowEnd}})
		if err != nil {
			t.Fatal(err)
		}
		return r[0]
	}
	steps := []struct {
		settler       string
		seq, n        uint64
		end           int64
		done, remains uint64
	}{
		{"a", 1, 50, end, 50, 20},
		{"a", 1, 50, end, 50, 20}, // the retry: counted already
		{"b", 1, 40, 0, 40, 0},    // another settler; past the limit
		{"a", 2, 5, end, 5, 0},
		{"a", 2, 5, 0, 5, 0},
		{"a", 3, 7, end - 3600e6, 7, 0}, // the window before: counted now
		{"a", 4, 7, end - 7200e6, 0, 0}, // older: not counted
		{"a", 5, 1, end + 3600e6, 1, 0}, // the next, by a clock ahead
	}
	for i, st := range steps {
		if r := settle(st.settler, st.seq, st.n, st.end); r.Hits != st.done || r.Remaining != st.remains {
			t.Errorf("step %d (%s seq %d, %d hits): %+v; want %d settled, %d remaining", i, st.settler, st.seq, st.n, r, st.done, st.remains)
		}
	}
	// The count is what was taken and settled once: 30 + 50 + 40 + 5 + 7 + 1.
	c.Hits = 1
	r, err := s.Evaluate(ctx, []limit.Check{hitsOf(c, 0)})
	if err != nil || r[0].Remaining != 0 {
		t.Fatalf("after the settles: %+v, %v", r, err)
	}
	raw, err := srv.Client().Get(ctx, "settled").Result()
	if want := fmt.Sprintf("%d:133", end); err != nil || raw != want {
		t.Errorf("the counter holds %q (%v); want %q", raw, err, want)
	}
	ttl, err := srv.Client().PTTL(ctx, redisstore.SettleMarksKey("settled")).Result()
	if err != nil || ttl <= 0 || ttl > 2*time.Hour+time.Minute {
		t.Errorf("the settle marks' TTL is %v (%v); want up to a window past the current one", ttl, err)
	}
}

// TestSettleOnCluster: a settle's counter and its marks share a hash
// slot, with or without a hash tag in the key (encoded keys escape
// braces: only a key prefix could hold one), so a Cluster home takes it.
func TestSettleOnCluster(t *testing.T) {
	_, s := clusterStore(t)
	ctx := context.Background()
	for _, key := range []string{"plain|key", "{tenant}|key", "pre{fix|key"} {
		c := limit.Check{Key: key, Limit: 10, WindowUS: 60e6}
		ops := []limit.GrantOp{{Check: hitsOf(c, 4)}, {Check: hitsOf(c, 9), Settle: true, Settler: "x", Seq: 1}, {Check: hitsOf(c, 9), Settle: true, Settler: "x", Seq: 1}}
		r, err := s.Grant(ctx, ops)
		if err != nil {
			t.Fatalf("%s: %v", key, err)
		}
		if r[0].Hits != 4 || r[1].Hits != 9 || r[2].Remaining != 0 {
			t.Errorf("%s: %+v; want 4 taken, 9 settled once, nothing left", key, r)
		}
	}
}
