package redisstore

import (
	"context"
	"runtime"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/internal/limit"
	"github.com/ratelimitd/ratelimitd/internal/redisstore/redistest"
)

// TestNodeBatcherRetires: a Cluster master's batcher that gets no calls
// for nodeIdle stops its dispatchers and leaves the map; the next call
// for that master makes a new one.
func TestNodeBatcherRetires(t *testing.T) {
	nodes := redistest.StartCluster(t, 3)
	s := pingedStore(t, Options{URL: redistest.ClusterURL(nodes), Mode: ModeCluster, Timeout: 2 * time.Second, Dispatchers: 2})
	s.nodeIdle = 100 * time.Millisecond // before any batcher exists
	ctx := context.Background()
	count := func() int {
		return s.nodes.len()
	}
	check := []limit.Check{{Key: "retire", Limit: 10, WindowUS: 3600e6, Hits: 1}}
	before := runtime.NumGoroutine()
	for round := 1; round <= 2; round++ {
		// No batcher before the call (none yet, or the last retired), so
		// the call served is served by one made for it. Counting after
		// the call raced the retirement: on a busy machine the call's
		// batcher could idle out its 100 ms before the count was read.
		if n := count(); n != 0 {
			t.Fatalf("round %d: %d batchers before the call, want 0", round, n)
		}
		r, err := s.Evaluate(ctx, check)
		if err != nil || r[0].Used(10) != uint64(round) {
			t.Fatalf("round %d: %+v, %v", round, r, err)
		}
		deadline := time.Now().Add(5 * time.Second)
		for count() != 0 && time.Now().Before(deadline) {
			time.Sleep(20 * time.Millisecond)
		}
		if n := count(); n != 0 {
			t.Fatalf("round %d: %d batchers after idling, want 0", round, n)
		}
	}
	time.Sleep(50 * time.Millisecond)
	if after := runtime.NumGoroutine(); after > before {
		t.Errorf("goroutines %d -> %d: retired dispatchers still running", before, after)
	}
}
