package redisstore_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/ratelimitd/ratelimitd/internal/limit"
	"github.com/ratelimitd/ratelimitd/internal/metrics"
	"github.com/ratelimitd/ratelimitd/internal/redisstore"
	"github.com/ratelimitd/ratelimitd/internal/redistest"
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
	open := func(carry bool, m *metrics.Metrics) *redisstore.Store {
		s, err := redisstore.New(redisstore.Options{URL: srv.URL(), Timeout: time.Second, CarryIncumbent: carry, Metrics: m})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		return s
	}
	m := metrics.New("test")
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
