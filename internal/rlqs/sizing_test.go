package rlqs

import (
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/config"
	"github.com/ratelimitd/ratelimitd/internal/limit"
	"github.com/ratelimitd/ratelimitd/internal/memstore"
	"github.com/ratelimitd/ratelimitd/internal/plan"
	"github.com/ratelimitd/ratelimitd/internal/service"
)

// TestRunsOutAcrossInstances: the counter's own count, which other
// instances' Envoys and RLS callers spend too, says whether it runs out
// this window, whatever this instance's one bucket sees. Half a minute
// into a window of 1,000, a bucket asking 5 a second with 10 tokens left
// sees plenty in the counter either way; the counter 650 spent is on
// course for 975 by the window's end (its grant is kept until spent),
// one 100 spent for 150 (it is replaced now).
func TestRunsOutAcrossInstances(t *testing.T) {
	snap, err := config.Parse("rules.yaml", []byte("domain: edge\ndescriptors:\n  - key: tenant\n    rate_limit: {unit: minute, requests_per_unit: 1000}\n"))
	if err != nil {
		t.Fatal(err)
	}
	store := memstore.New(memstore.Options{})
	srv := New(service.New(snap, store, nil, service.Options{}), store, Options{})
	ss, err := srv.NewSession()
	if err != nil {
		t.Fatal(err)
	}
	defer ss.Close()
	start := time.Unix(1_800_000_000, 0).Truncate(time.Minute)
	now := start.Add(30 * time.Second)
	for _, tc := range []struct {
		remaining uint64
		want      bool
	}{{350, true}, {900, false}} {
		b := &bucket{
			plan:       plan.Bucket{Check: limit.Check{Key: "k", Limit: 1000, WindowUS: 60e6, Algorithm: limit.FixedWindow}},
			subscribed: "k",
			meter:      meter{rate: 5, since: now},
			lastReport: now,
		}
		srv.mu.Lock()
		srv.counters["k"] = &counter{subs: 1, remaining: tc.remaining, validTill: start.Add(time.Minute), rls: newMeter(now)}
		srv.mu.Unlock()
		if got := ss.runsOut(b, now, 10); got != tc.want {
			t.Errorf("counter with %d of 1000 left half-way: runs out %v, want %v", tc.remaining, got, tc.want)
		}
	}
}
