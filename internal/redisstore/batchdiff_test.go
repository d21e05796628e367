package redisstore

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/internal/limit"
	"github.com/ratelimitd/ratelimitd/internal/memstore"
	"github.com/ratelimitd/ratelimitd/internal/redisstore/redistest"
)

// TestBatchMatchesMemstore is the differential test for batches: random
// script calls of 1 to 24 requests, each of 1 to 3 keys drawn from a few,
// so that a key comes again in a later request of the same call, on
// every algorithm; mostly plain hits (the script's one-key fast path),
// with refunds, shadow and usage checks mixed in (its general path), and
// a clock that moves between calls. Each request must be decided exactly
// as limit.Decide (memstore) decides the requests one after another.
func TestBatchMatchesMemstore(t *testing.T) {
	srv := redistest.Start(t)
	var clock atomic.Int64
	clock.Store(time.Now().UnixMicro())
	now := func() time.Time { return time.UnixMicro(clock.Load()) }
	s := pingedStore(t, Options{URL: srv.URL(), Timeout: 2 * time.Second, ScriptTime: now})
	ms := memstore.New(memstore.Options{Now: now})
	rng := rand.New(rand.NewPCG(3, 4))
	rules := []limit.Check{
		{Limit: 5, WindowUS: 1e6}, {Limit: 40, WindowUS: 60e6}, {Limit: 0, WindowUS: 60e6},
		{Limit: 1 << 50, WindowUS: 3600e6},
		{Limit: 7, WindowUS: 1e6, Algorithm: limit.SlidingWindow},
		{Limit: 10, WindowUS: 1e6, Algorithm: limit.TokenBucket, Burst: 4},
	}
	ctx := context.Background()
	var fastShaped, calls int
	for i := range 1500 {
		if rng.IntN(4) == 0 {
			clock.Add(rng.Int64N(3e6))
		}
		reqs := make([][]limit.Check, 1+rng.IntN(24))
		for r := range reqs {
			seen := map[string]bool{}
			for range 1 + rng.IntN(3)*rng.IntN(2) {
				ri := rng.IntN(len(rules))
				c := rules[ri]
				c.Key = fmt.Sprintf("b%d:%d", ri, rng.IntN(4))
				if seen[c.Key] {
					continue
				}
				seen[c.Key] = true
				c.Hits = uint64(rng.IntN(4))
				if rng.IntN(30) == 0 {
					c.Hits = 1 << 50
				}
				switch rng.IntN(12) {
				case 0:
					c.Refund = true
				case 1:
					c.NoVeto = true
				case 2:
					c.Usage, c.FlightS, c.Kind = true, 1+rng.Int64N(5), limit.UsageKind(rng.IntN(4))
				}
				reqs[r] = append(reqs[r], c)
			}
			if len(reqs[r]) == 1 && reqs[r][0].Algorithm == limit.FixedWindow && !reqs[r][0].Refund && !reqs[r][0].NoVeto && !reqs[r][0].Usage {
				fastShaped++
			}
		}
		vals, err := s.run(ctx, reqs)
		if err != nil {
			t.Fatal(err)
		}
		calls++
		k0 := 0
		for r, checks := range reqs {
			part, err := splitReply(vals, k0, len(checks))
			if err != nil {
				t.Fatalf("call %d request %d: %v", i, r, err)
			}
			k0 += len(checks)
			want, _ := ms.Evaluate(ctx, checks)
			for j := range want {
				over, _ := part[3*j].(int64)
				remaining, _ := part[3*j+1].(int64)
				reset, _ := part[3*j+2].(int64)
				got := limit.Result{Over: over == 1, Remaining: uint64(remaining), ResetUS: reset}
				if got != want[j] {
					t.Fatalf("call %d request %d check %d %+v at %d: redis %+v, memstore %+v", i, r, j, checks[j], clock.Load(), got, want[j])
				}
			}
		}
	}
	t.Logf("%d calls identical; %d requests of the fast path's shape", calls, fastShaped)
}
