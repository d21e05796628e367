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

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/ratelimitd/ratelimitd/internal/limit"
	"github.com/ratelimitd/ratelimitd/internal/redisstore"
	"github.com/ratelimitd/ratelimitd/internal/redisstore/redistest"
)

// BenchmarkChargeFailover: streams check a shared budget and charge 1,000
// to 4,000 tokens 5-25 ms later, through a master, a replica and
// Sentinel (the project's helpers); after 1 s the replica lags: its link
// is held (lag=held: what it has not read is gone when the master dies)
// or the replica stopped for 2 s (lag=stopped, as DEBUG SLEEP: what the
// master sent waits in its socket and is applied when it wakes, after
// the journal saw it unacknowledged); 1 s later the master is killed and
// Sentinel promotes the replica; the streams go on
// until the new master has answered for 1 s. With lag=cluster the same
// on a Redis Cluster of three masters with a replica each: the budget
// slot's replica stopped 2 s, its master killed 1 s into it, the
// replica promoted by the Cluster. It reports the tokens the
// clients charged (every charge sent and answered, recorded or answered
// by the failure policy) against the count on the new master once the
// journal is drained: lost_tokens (charged, not
// counted) and double_tokens (counted twice), with --charge-journal and
// without, and the budget checks' p99 before the hold (the journal must
// not slow them).
//
//	go test -run XXX -bench ChargeFailover -benchtime 1x ./internal/redisstore/
func BenchmarkChargeFailover(b *testing.B) {
	for _, lag := range []string{"held", "stopped", "cluster"} {
		for _, streams := range []int{8, 64} {
			for _, on := range []bool{false, true} {
				b.Run(fmt.Sprintf("lag=%s/streams=%d/journal=%v", lag, streams, on), func(b *testing.B) {
					failoverBench(b, streams, on, lag)
				})
			}
		}
	}
}

// failoverBench runs chargeFailover b.N times and reports its figures.
func failoverBench(b *testing.B, streams int, on bool, lag string) {
	var lost, double, p99, charged float64
	for range b.N {
		var r failoverRun
		if lag == "cluster" {
			r = chargeClusterFailover(b, streams, on)
		} else {
			r = chargeFailover(b, streams, on, lag == "stopped")
		}
		lost, double, p99, charged = lost+r.lost, double+r.double, max(p99, r.p99ms), charged+r.charged
	}
	n := float64(b.N)
	b.ReportMetric(charged/n, "tokens_charged")
	b.ReportMetric(lost/n, "lost_tokens")
	b.ReportMetric(double/n, "double_tokens")
	b.ReportMetric(p99, "check_p99_ms")
}

type failoverRun struct{ charged, lost, double, p99ms float64 }

// budgetStreams runs streams against the store: each checks a shared
// budget and charges 1,000 to 4,000 tokens 5-25 ms later, whatever the
// check's answer (the failure policy allow lets it through), until stop
// closes; charged counts the tokens of every charge a stream sent and
// got an answer for, recorded or not; lat collects the checks' latencies
// while healthy.
type budgetStreams struct {
	budget  limit.Check
	charged atomic.Uint64
	healthy atomic.Bool
	mu      sync.Mutex
	lat     []time.Duration
	stop    chan struct{}
	wg      sync.WaitGroup
}

func runBudgetStreams(s *redisstore.Store, streams int) *budgetStreams {
	bs := &budgetStreams{budget: limit.Check{Key: "spend", Limit: 1 << 50, WindowUS: 24 * 3600e6, Usage: true, FlightS: 300}, stop: make(chan struct{})}
	bs.healthy.Store(true)
	ctx := context.Background()
	for i := range streams {
		bs.wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(i), 1))
			for {
				select {
				case <-bs.stop:
					return
				default:
				}
				t0 := time.Now()
				_, err := s.Evaluate(ctx, []limit.Check{bs.budget})
				if d := time.Since(t0); err == nil && bs.healthy.Load() {
					bs.mu.Lock()
					bs.lat = append(bs.lat, d)
					bs.mu.Unlock()
				}
				time.Sleep(time.Duration(5+rng.IntN(21)) * time.Millisecond)
				c := bs.budget
				c.Hits = uint64(1000 + rng.IntN(3001))
				_, _ = s.Evaluate(ctx, []limit.Check{c})
				bs.charged.Add(c.Hits)
			}
		})
	}
	return bs
}

// awaitAnswer waits until the store answers again after trouble (at
// most 60 s), lets the streams run a second more, and returns the
// deadline the journal then has to drain by.
func (bs *budgetStreams) awaitAnswer(b *testing.B, s *redisstore.Store, after string) time.Time {
	deadline := time.Now().Add(60 * time.Second)
	for {
		if _, err := s.Evaluate(context.Background(), []limit.Check{bs.budget}); err == nil {
			break
		}
		if time.Now().After(deadline) {
			close(bs.stop)
			bs.wg.Wait()
			b.Fatalf("the store did not answer within 60s of %s", after)
		}
		time.Sleep(50 * time.Millisecond)
	}
	time.Sleep(time.Second)
	return deadline
}

// finish stops the streams, waits out the journal (on: its pending
// charges, until deadline) and measures the budget against the charges.
func (bs *budgetStreams) finish(b *testing.B, s *redisstore.Store, m *redisstore.Metrics, on bool, deadline time.Time) failoverRun {
	close(bs.stop)
	bs.wg.Wait()
	if on {
		for testutil.ToFloat64(m.JournalPending) > 0 && time.Now().Before(deadline) {
			time.Sleep(20 * time.Millisecond)
		}
	}
	r, err := s.Evaluate(context.Background(), []limit.Check{bs.budget})
	if err != nil {
		b.Fatal(err)
	}
	counted, want := bs.budget.Limit-r[0].Remaining, bs.charged.Load()
	slices.Sort(bs.lat)
	run := failoverRun{charged: float64(want)}
	if len(bs.lat) > 0 {
		run.p99ms = float64(bs.lat[len(bs.lat)*99/100].Microseconds()) / 1000
	}
	if counted < want {
		run.lost = float64(want - counted)
	} else {
		run.double = float64(counted - want)
	}
	b.Logf("journal %v: clients charged %d tokens, the store counts %d (lost %.3f %%, twice %.3f %%); journal: reapplied %v, kept %v, applied %v, resent %v, dropped %v; checks before the trouble: %d, p99 %.2f ms",
		on, want, counted, 100*run.lost/float64(want), 100*run.double/float64(want), journalOutcomeF(m, redisstore.JournalReapplied),
		journalOutcomeF(m, redisstore.JournalKept), journalOutcomeF(m, redisstore.JournalApplied), journalOutcomeF(m, redisstore.JournalResent),
		journalOutcomeF(m, redisstore.JournalDropped), len(bs.lat), run.p99ms)
	return run
}

func journalOutcomeF(m *redisstore.Metrics, outcome string) float64 {
	return testutil.ToFloat64(m.JournalCharges.WithLabelValues(outcome))
}

func chargeFailover(b *testing.B, streams int, on, stopped bool) failoverRun {
	st, link := redistest.StartSentinelLinked(b)
	s, m := failoverStore(b, st.URL(), on)
	defer s.Close()
	ctx := context.Background()
	bs := runBudgetStreams(s, streams)
	time.Sleep(time.Second)
	bs.healthy.Store(false)
	if stopped {
		st.Replica.Pause()
		time.AfterFunc(2*time.Second, st.Replica.Resume)
	} else {
		link.Hold()
	}
	time.Sleep(time.Second)
	mi, _ := st.Master.Client().Info(ctx, "replication").Result()
	ri, _ := st.Replica.Client().Info(ctx, "replication").Result()
	b.Logf("at the kill: master offset %s, replica offset %s, clients charged %d", redisstore.InfoField(mi, "master_repl_offset"), redisstore.InfoField(ri, "slave_repl_offset"), bs.charged.Load())
	old := st.Master.Addr()
	st.Master.Kill()
	link.Cut()
	st.AwaitFailover(b, old, 20*time.Second, 60*time.Second)
	deadline := bs.awaitAnswer(b, s, "the failover")
	b.Logf("streams %d: failover", streams)
	return bs.finish(b, s, m, on, deadline)
}

// chargeClusterFailover is chargeFailover's lag=cluster.
func chargeClusterFailover(b *testing.B, streams int, on bool) failoverRun {
	c := redistest.StartReplicatedCluster(b, 3)
	s, m := failoverStore(b, c.URL(), on, func(o *redisstore.Options) { o.Mode = redisstore.ModeCluster })
	defer func() {
		s.Close()
		awaitDialersGone(b)
	}()
	ctx := context.Background()
	bs := runBudgetStreams(s, streams)
	sl, err := c.Masters[0].Client().ClusterKeySlot(ctx, bs.budget.Key).Result()
	if err != nil {
		b.Fatal(err)
	}
	i := c.MasterOf(int(sl))
	time.Sleep(time.Second)
	bs.healthy.Store(false)
	c.Replicas[i].Pause()
	time.AfterFunc(2*time.Second, c.Replicas[i].Resume)
	time.Sleep(time.Second)
	c.Masters[i].Kill()
	c.AwaitPromotion(b, i, 15*time.Second, 60*time.Second)
	deadline := bs.awaitAnswer(b, s, "the failover")
	b.Logf("streams %d: Cluster failover", streams)
	return bs.finish(b, s, m, on, deadline)
}

// BenchmarkChargeOutage: the streams of BenchmarkChargeFailover on one
// Redis (no replica) through trouble: a stall (the process stopped 3 s,
// then resumed), an outage (unreachable 10 s: the network to it cut,
// then restored) or a restart without persistence (killed, started
// empty: the window's charges are gone whatever ratelimitd keeps), each
// after 1 s of traffic, the streams going on until
// it has answered for 1 s. Reported as BenchmarkChargeFailover's, with
// the journal (--charge-journal auto's default here) and without.
//
//	go test -run XXX -bench ChargeOutage -benchtime 1x ./internal/redisstore/
func BenchmarkChargeOutage(b *testing.B) {
	for _, trouble := range []string{"stall3s", "outage10s", "restart-empty"} {
		for _, streams := range []int{8, 64} {
			for _, on := range []bool{false, true} {
				b.Run(fmt.Sprintf("%s/streams=%d/journal=%v", trouble, streams, on), func(b *testing.B) {
					var lost, double, charged float64
					for range b.N {
						r := chargeOutage(b, trouble, streams, on)
						lost, double, charged = lost+r.lost, double+r.double, charged+r.charged
					}
					n := float64(b.N)
					b.ReportMetric(charged/n, "tokens_charged")
					b.ReportMetric(lost/n, "lost_tokens")
					b.ReportMetric(double/n, "double_tokens")
				})
			}
		}
	}
}

func chargeOutage(b *testing.B, trouble string, streams int, on bool) failoverRun {
	srv := redistest.Start(b)
	link := redistest.NewLink(b, srv.Addr())
	m := redisstore.NewMetrics(prometheus.NewRegistry())
	s, err := redisstore.New(redisstore.Options{URL: fmt.Sprintf("redis://127.0.0.1:%d", link.Port), ProbeInterval: 100 * time.Millisecond,
		ChargeJournal: on, Metrics: m})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	bs := runBudgetStreams(s, streams)
	time.Sleep(time.Second)
	bs.healthy.Store(false)
	switch trouble {
	case "stall3s":
		srv.Pause()
		time.Sleep(3 * time.Second)
		srv.Resume()
	case "restart-empty":
		srv.Restart()
	default:
		link.Cut()
		time.Sleep(10 * time.Second)
		link.Restore(b)
	}
	deadline := bs.awaitAnswer(b, s, "the trouble's end")
	b.Logf("%s, streams %d", trouble, streams)
	return bs.finish(b, s, m, on, deadline)
}
