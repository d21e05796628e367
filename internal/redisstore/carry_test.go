package redisstore_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/ratelimitd/ratelimitd/internal/limit"
	"github.com/ratelimitd/ratelimitd/internal/redisstore"
	"github.com/ratelimitd/ratelimitd/internal/redisstore/redistest"
)

// TestCarryIncumbentCounts: with CarryIncumbent, a fixed-window counter
// the store first writes in a window starts from envoyproxy/ratelimit's
// count of that window, its key written as the incumbent writes it
// (INCRBY, EXPIRE); a counter already written this window (by this
// instance or another) is not started again; an incumbent key that holds
// no count, or is of another type, is ignored and counted; without the
// option nothing is carried.
func TestCarryIncumbentCounts(t *testing.T) {
	srv := redistest.Start(t)
	redistest.AwayFromHourEnd(10 * time.Second)
	ctx := context.Background()
	admin := srv.Client()
	start := time.Now().Unix() / 3600 * 3600
	incumbent := func(user string) string { return fmt.Sprintf("pfx:ai_user_%s_%d", user, start) }
	admin.IncrBy(ctx, incumbent("u1"), 900)
	admin.Expire(ctx, incumbent("u1"), time.Hour)
	admin.Set(ctx, incumbent("u2"), "garbage", time.Hour)
	admin.RPush(ctx, incumbent("u3"), "a list")
	admin.IncrBy(ctx, incumbent("u4"), 900)
	open := func(carry bool, m *redisstore.Metrics) *redisstore.Store {
		s, err := redisstore.New(redisstore.Options{URL: srv.URL(), Timeout: time.Second, CarryIncumbent: carry, Metrics: m})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		return s
	}
	m := redisstore.NewMetrics(prometheus.NewRegistry())
	s := open(true, m)
	check := func(st *redisstore.Store, user string, hits uint64) limit.Result {
		t.Helper()
		res, err := st.Evaluate(ctx, []limit.Check{{Key: "rl:" + user, Limit: 1000, WindowUS: 3600e6, Hits: hits,
			Incumbent: "pfx:ai_user_" + user + "_"}})
		if err != nil {
			t.Fatal(err)
		}
		return res[0]
	}
	if r := check(s, "u1", 100); r.Over || r.Remaining != 0 {
		t.Fatalf("100 more on 900 the incumbent counted, of 1,000: %+v, want admitted with 0 left", r)
	}
	if r := check(s, "u1", 1); !r.Over {
		t.Fatalf("past the budget: %+v, want over", r)
	}
	// The incumbent counts on; this counter was started once this window.
	admin.IncrBy(ctx, incumbent("u1"), 50)
	if r := check(open(true, nil), "u1", 0); r.Remaining != 0 {
		t.Fatalf("another instance: %+v", r)
	}
	for _, u := range []string{"u2", "u3"} {
		if r := check(s, u, 1); r.Over || r.Remaining != 999 {
			t.Fatalf("%s, an incumbent key that holds no count: %+v, want 999 left", u, r)
		}
	}
	if got := testutil.ToFloat64(m.IncumbentCounts.WithLabelValues("not_a_count")); got != 2 {
		t.Errorf("not_a_count %v, want 2", got)
	}
	if got := testutil.ToFloat64(m.IncumbentCounts.WithLabelValues("carried")); got != 1 {
		t.Errorf("carried %v, want 1", got)
	}
	if r := check(open(false, nil), "u4", 1); r.Remaining != 999 {
		t.Fatalf("without the option: %+v, want 999 left", r)
	}
	if _, err := redisstore.New(redisstore.Options{URL: redistest.ClusterURL([]*redistest.Server{srv}), Mode: redisstore.ModeCluster, CarryIncumbent: true}); err == nil {
		t.Error("carrying on Cluster accepted")
	}
}

// TestCarryEachWindow: a counter is asked about the incumbent's count
// once in each of its windows, not once ever: the next window starts
// from the incumbent's count of that window too. And a budget's state is
// carried from the window before only: one left from two windows ago is
// dropped when the count is seeded.
func TestCarryEachWindow(t *testing.T) {
	srv := redistest.Start(t)
	ctx := context.Background()
	admin := srv.Client()
	const hour = int64(3600)
	start := time.Now().Unix()/hour*hour + 10*hour // a window of the script's clock, ahead of Redis's
	var clock atomic.Int64
	clock.Store((start + 600) * 1_000_000)
	s, err := redisstore.New(redisstore.Options{URL: srv.URL(), Timeout: time.Second, CarryIncumbent: true,
		ScriptTime: func() time.Time { return time.UnixMicro(clock.Load()) }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	check := func(user string) limit.Result {
		t.Helper()
		res, err := s.Evaluate(ctx, []limit.Check{{Key: "rl:" + user, Limit: 1000, WindowUS: hour * 1e6, Hits: 1,
			Incumbent: "pfx:ai_user_" + user + "_"}})
		if err != nil {
			t.Fatal(err)
		}
		return res[0]
	}
	for w, count := range []int64{100, 200, 300} {
		admin.Set(ctx, fmt.Sprintf("pfx:ai_user_u_%d", start+int64(w)*hour), count, 4*time.Hour)
	}
	for w, want := range []uint64{899, 799, 699} {
		if r := check("u"); r.Remaining != want {
			t.Fatalf("window %d: %+v, want %d left (the incumbent's count of that window, and this request)", w, r, want)
		}
		clock.Add(hour * 1_000_000)
	}

	// A budget's state from two windows before the current one.
	now := clock.Load() / 1_000_000
	end := (now/hour + 1) * hour
	admin.Set(ctx, "rl:v", fmt.Sprintf("%d:5|1024000/4/100", (end-2*hour)*1_000_000), time.Hour)
	admin.Set(ctx, fmt.Sprintf("pfx:ai_user_v_%d", end-hour), 300, time.Hour)
	check("v")
	if got := admin.Get(ctx, "rl:v").Val(); got != fmt.Sprintf("%d:301", end*1_000_000) {
		t.Fatalf("rl:v holds %q, want the incumbent's 300 and this request, with no budget's state", got)
	}
}
