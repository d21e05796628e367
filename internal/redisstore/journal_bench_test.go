package redisstore_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/ratelimitd/ratelimitd/internal/limit"
	"github.com/ratelimitd/ratelimitd/internal/redisstore"
	"github.com/ratelimitd/ratelimitd/internal/redistest"
)

// BenchmarkChargeFailover: streams check a shared budget and charge 1,000
// to 4,000 tokens 5-25 ms later, through a master, a replica and
// Sentinel (the project's helpers); after 1 s the replica's link is held
// (it lags), 1 s later the master is killed (what the replica had not
// read is gone) and Sentinel promotes the replica; the streams go on
// until the new master has answered for 1 s. It reports the tokens the
// clients had charged (the store said recorded) against the count on the
// new master once the journal is drained: lost_tokens (charged, not
// counted) and double_tokens (counted twice), with --charge-journal and
// without, and the budget checks' p99 before the hold (the journal must
// not slow them).
//
//	go test -run XXX -bench ChargeFailover -benchtime 1x ./internal/redisstore/
func BenchmarkChargeFailover(b *testing.B) {
	for _, streams := range []int{8, 64} {
		for _, on := range []bool{false, true} {
			b.Run(fmt.Sprintf("streams=%d/journal=%v", streams, on), func(b *testing.B) {
				var lost, double, p99, charged float64
				for range b.N {
					r := chargeFailover(b, streams, on)
					lost, double, p99, charged = lost+r.lost, double+r.double, max(p99, r.p99ms), charged+r.charged
				}
				n := float64(b.N)
				b.ReportMetric(charged/n, "tokens_charged")
				b.ReportMetric(lost/n, "lost_tokens")
				b.ReportMetric(double/n, "double_tokens")
				b.ReportMetric(p99, "check_p99_ms")
			})
		}
	}
}

type failoverRun struct{ charged, lost, double, p99ms float64 }

func chargeFailover(b *testing.B, streams int, on bool) failoverRun {
	st, link := redistest.StartSentinelLinked(b)
	s, m := failoverStore(b, st.URL(), on)
	defer s.Close()
	budget := limit.Check{Key: "spend", Limit: 1 << 50, WindowUS: 24 * 3600e6, Usage: true, FlightS: 300}
	ctx := context.Background()
	var charged atomic.Uint64
	var healthy atomic.Bool
	healthy.Store(true)
	var mu sync.Mutex
	var lat []time.Duration
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for i := range streams {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(i), 1))
			for {
				select {
				case <-stop:
					return
				default:
				}
				t0 := time.Now()
				_, err := s.Evaluate(ctx, []limit.Check{budget})
				if d := time.Since(t0); err == nil && healthy.Load() {
					mu.Lock()
					lat = append(lat, d)
					mu.Unlock()
				}
				if err != nil {
					time.Sleep(20 * time.Millisecond)
					continue
				}
				time.Sleep(time.Duration(5+rng.IntN(21)) * time.Millisecond)
				c := budget
				c.Hits = uint64(1000 + rng.IntN(3001))
				if _, err := s.Evaluate(ctx, []limit.Check{c}); err == nil {
					charged.Add(c.Hits)
				}
			}
		})
	}
	time.Sleep(time.Second)
	healthy.Store(false)
	link.Hold()
	time.Sleep(time.Second)
	mi, _ := st.Master.Client().Info(ctx, "replication").Result()
	ri, _ := st.Replica.Client().Info(ctx, "replication").Result()
	b.Logf("at the kill: master offset %s, replica offset %s, clients charged %d", redisstore.InfoField(mi, "master_repl_offset"), redisstore.InfoField(ri, "slave_repl_offset"), charged.Load())
	old := st.Master.Addr()
	st.Master.Kill()
	link.Cut()
	st.AwaitFailover(b, old, 20*time.Second, 60*time.Second)
	deadline := time.Now().Add(60 * time.Second)
	for {
		if _, err := s.Evaluate(ctx, []limit.Check{budget}); err == nil {
			break
		}
		if time.Now().After(deadline) {
			close(stop)
			wg.Wait()
			b.Fatal("the store found no new master within 60s of the failover")
		}
		time.Sleep(50 * time.Millisecond)
	}
	time.Sleep(time.Second)
	close(stop)
	wg.Wait()
	if on {
		for testutil.ToFloat64(m.JournalPending) > 0 && time.Now().Before(deadline) {
			time.Sleep(20 * time.Millisecond)
		}
	}
	r, err := s.Evaluate(ctx, []limit.Check{budget})
	if err != nil {
		b.Fatal(err)
	}
	counted, want := budget.Limit-r[0].Remaining, charged.Load()
	slices.Sort(lat)
	run := failoverRun{charged: float64(want), p99ms: float64(lat[len(lat)*99/100].Microseconds()) / 1000}
	if counted < want {
		run.lost = float64(want - counted)
	} else {
		run.double = float64(counted - want)
	}
	b.Logf("streams %d, journal %v: clients charged %d tokens, the new master counts %d (re-applied %v, confirmed %v); checks before the hold: %d, p99 %.2f ms",
		streams, on, want, counted, testutil.ToFloat64(m.JournalCharges.WithLabelValues(redisstore.JournalReapplied)),
		testutil.ToFloat64(m.JournalCharges.WithLabelValues(redisstore.JournalConfirmed)), len(lat), run.p99ms)
	return run
}
