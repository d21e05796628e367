package redisstore

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/ratelimitd/ratelimitd/internal/limit"
	"github.com/ratelimitd/ratelimitd/internal/metrics"
	"github.com/ratelimitd/ratelimitd/internal/redistest"
)

// leaseStore is a store with leases every interval, on srv, with its
// own metrics; clock, when set, is the scripted clock of both Redis and
// the leases.
func leaseStore(t *testing.T, srv *redistest.Server, interval time.Duration, clock func() time.Time) (*Store, *metrics.Metrics) {
	t.Helper()
	m := metrics.New("test")
	s, err := New(Options{URL: srv.URL(), Timeout: time.Second, LeaseInterval: interval, ScriptTime: clock, Metrics: m})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s, m
}

// manual stops s's refiller, so that a test runs its passes itself.
func manual(s *Store) {
	close(s.leaseStop)
	s.leaseWG.Wait()
	s.leaseStop = make(chan struct{})
	s.leaseWG.Go(func() { <-s.leaseStop })
}

func hits(m *metrics.Metrics, what string) uint64 {
	return uint64(testutil.ToFloat64(m.LeaseHits.WithLabelValues(what)))
}

func locals(m *metrics.Metrics) uint64 {
	return uint64(testutil.ToFloat64(m.LeaseDecisions.WithLabelValues("local")))
}

var leaseRules = []limit.Check{
	{Limit: 100, WindowUS: 3600e6, Lease: true},
	{Limit: 100, WindowUS: 3600e6, Algorithm: limit.SlidingWindow, Lease: true},
	{Limit: 100, WindowUS: 3600e6, Algorithm: limit.TokenBucket, Lease: true},
}

// TestLeaseFleetNeverExceeds: three instances share a leased counter of
// limit 100 and get 200 requests each, spread over time so that grants
// are taken: together they admit exactly 100, most of them decided in
// process, on each algorithm.
func TestLeaseFleetNeverExceeds(t *testing.T) {
	srv := redistest.Start(t)
	for ri, rule := range leaseRules {
		t.Run(rule.Algorithm.String(), func(t *testing.T) {
			var fleet []*Store
			var ms []*metrics.Metrics
			for range 3 {
				s, m := leaseStore(t, srv, 20*time.Millisecond, nil)
				fleet, ms = append(fleet, s), append(ms, m)
			}
			c := rule
			c.Key, c.Hits = fmt.Sprintf("fleet%d", ri), 1
			var admitted, failed atomic.Int64
			var wg sync.WaitGroup
			for _, s := range fleet {
				for range 4 {
					wg.Go(func() {
						for range 50 {
							r, err := s.Evaluate(context.Background(), []limit.Check{c})
							switch {
							case err != nil:
								failed.Add(1)
							case !r[0].Over:
								admitted.Add(1)
							}
							time.Sleep(time.Millisecond)
						}
					})
				}
			}
			wg.Wait()
			if failed.Load() != 0 || admitted.Load() != 100 {
				t.Errorf("admitted %d of 600 (%d failed), want exactly 100", admitted.Load(), failed.Load())
			}
			var local uint64
			for _, m := range ms {
				local += locals(m)
			}
			if local < 30 {
				t.Errorf("%d requests decided in process; the test wants grants in use", local)
			}
		})
	}
}

// TestLeaseRollover: hits granted in a window are never used in the
// next; they are counted lost, and the next window admits its limit.
func TestLeaseRollover(t *testing.T) {
	srv := redistest.Start(t)
	var clock atomic.Int64
	clock.Store(time.Now().Truncate(time.Hour).Add(time.Hour).UnixMicro()) // a window start
	now := func() time.Time { return time.UnixMicro(clock.Load()) }
	s, m := leaseStore(t, srv, 100*time.Millisecond, now)
	manual(s)
	c := limit.Check{Key: "roll", Limit: 1000, WindowUS: 1e6, Hits: 1, Lease: true}
	ask := func() bool {
		r, err := s.Evaluate(context.Background(), []limit.Check{c})
		if err != nil {
			t.Fatal(err)
		}
		return !r[0].Over
	}
	ask() // the counter is known
	s.leases.entries[c.Key].rate = 2000
	clock.Add(900e3)
	s.leases.pass(false)
	held := s.leases.entries[c.Key].avail
	if held < 2 {
		t.Fatalf("no grant taken: %d held", held)
	}
	ask()
	clock.Add(100e3) // the next window
	n := 0
	for range 1500 {
		if ask() {
			n++
		}
	}
	if n != 1000 {
		t.Errorf("the next window admitted %d, want exactly its 1000", n)
	}
	s.leases.pass(false)
	if lost := hits(m, "lost"); lost != held-1 {
		t.Errorf("%d hits counted lost, want the %d left of the old window's grant", lost, held-1)
	}
}

// TestLeaseMixedRejected: a request with a leased and an exact counter,
// rejected by the exact one, takes nothing from the grant; admitted, it
// takes from both.
func TestLeaseMixedRejected(t *testing.T) {
	srv := redistest.Start(t)
	var clock atomic.Int64
	clock.Store(time.Now().UnixMicro())
	now := func() time.Time { return time.UnixMicro(clock.Load()) }
	s, _ := leaseStore(t, srv, 100*time.Millisecond, now)
	manual(s)
	leased := limit.Check{Key: "mix:l", Limit: 1000, WindowUS: 3600e6, Hits: 1, Lease: true}
	exact := limit.Check{Key: "mix:e", Limit: 1, WindowUS: 3600e6, Hits: 1}
	if _, err := s.Evaluate(context.Background(), []limit.Check{leased}); err != nil {
		t.Fatal(err)
	}
	s.leases.entries[leased.Key].rate = 5000
	s.leases.pass(false)
	g := s.leases.entries[leased.Key]
	before := g.avail
	r, err := s.Evaluate(context.Background(), []limit.Check{leased, exact})
	if err != nil || r[0].Over || r[1].Over || g.avail != before-1 {
		t.Fatalf("admitted: %+v %v, %d held of %d", r, err, g.avail, before)
	}
	r, err = s.Evaluate(context.Background(), []limit.Check{leased, exact})
	if err != nil || !r[1].Over || g.avail != before-1 {
		t.Errorf("rejected by the exact counter: %+v %v; %d held, want %d (untouched)", r, err, g.avail, before-1)
	}
	// Redis's count of the leased counter is the grant and the exact-path hits only.
	raw, _ := srv.Client().Get(context.Background(), leased.Key).Result()
	if want := fmt.Sprintf(":%d", before+1); len(raw) < len(want) || raw[len(raw)-len(want):] != want {
		t.Errorf("leased counter in Redis %q, want the first request and the grant (%d)", raw, before+1)
	}
}

// TestLeaseDifferential: on the same random traffic (several counters,
// requests of one and two descriptors, refunds, a scripted clock across
// many windows, refills at random moments), a store with leases admits
// exactly what one without admits for fixed windows, and differs by no
// more than the hits it reports lost for the others.
func TestLeaseDifferential(t *testing.T) {
	srv := redistest.Start(t)
	for _, algo := range []limit.Algorithm{limit.FixedWindow, limit.SlidingWindow, limit.TokenBucket} {
		t.Run(algo.String(), func(t *testing.T) {
			var clock atomic.Int64
			clock.Store(time.Now().UnixMicro())
			now := func() time.Time { return time.UnixMicro(clock.Load()) }
			leased, m := leaseStore(t, srv, 100*time.Millisecond, now)
			manual(leased)
			plain, _ := leaseStore(t, srv, -1, now)
			rng := rand.New(rand.NewPCG(uint64(algo), 9))
			rules := []limit.Check{{Limit: 50, WindowUS: 1e6}, {Limit: 300, WindowUS: 10e6}, {Limit: 7, WindowUS: 2e6}}
			differ := 0
			for i := range 6000 {
				clock.Add(rng.Int64N(3000))
				var req []limit.Check
				for j := range 1 + rng.IntN(2) {
					ri := rng.IntN(len(rules))
					if j == 1 && req[0].Key == fmt.Sprintf("d%v:%d", algo, ri) {
						continue
					}
					c := rules[ri]
					c.Algorithm, c.Key, c.Lease = algo, fmt.Sprintf("d%v:%d", algo, ri), true
					c.Hits = uint64(1 + rng.IntN(3))
					if rng.IntN(25) == 0 {
						c.Refund = true
					}
					req = append(req, c)
				}
				if rng.IntN(40) == 0 {
					leased.leases.mu.Lock()
					for _, g := range leased.leases.entries {
						g.rate = float64(200 + rng.IntN(2000))
					}
					leased.leases.mu.Unlock()
					leased.leases.pass(false)
				}
				a, err := leased.Evaluate(context.Background(), req)
				if err != nil {
					t.Fatal(err)
				}
				other := make([]limit.Check, len(req))
				for j, c := range req {
					c.Key, c.Lease = "p"+c.Key, false
					other[j] = c
				}
				b, err := plain.Evaluate(context.Background(), other)
				if err != nil {
					t.Fatal(err)
				}
				if admittedAll(req, a) != admittedAll(other, b) {
					differ++
					if algo == limit.FixedWindow {
						t.Fatalf("request %d %+v: leased %+v, plain %+v", i, req, a, b)
					}
				}
			}
			leased.leases.pass(false)
			if lost := hits(m, "lost") + hits(m, "given_back"); uint64(differ) > lost {
				t.Errorf("%d decisions differ, more than the %d hits lost or given back", differ, lost)
			}
			if locals(m) == 0 {
				t.Error("no request decided in process: the test wants grants in use")
			}
			t.Logf("%s: %d differ; lost %d, given back %d, local %d", algo, differ, hits(m, "lost"), hits(m, "given_back"), locals(m))
		})
	}
}

func admittedAll(checks []limit.Check, res []limit.Result) bool {
	for i := range checks {
		if res[i].Over && !checks[i].NoVeto && !checks[i].Refund {
			return false
		}
	}
	return true
}
