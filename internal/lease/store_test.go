package lease

import (
	"context"
	"fmt"
	"math/rand/v2"
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

// leaseStore is a store with leases every interval over a redisstore on
// srv, with its own metrics; clock, when set, is the scripted clock of
// both Redis and the leases.
func leaseStore(t *testing.T, srv *redistest.Server, interval time.Duration, clock func() time.Time) (*Store, *Metrics) {
	t.Helper()
	reg := prometheus.NewRegistry()
	m := NewMetrics(reg)
	rs, err := redisstore.New(redisstore.Options{URL: srv.URL(), Timeout: time.Second, ScriptTime: clock, Metrics: redisstore.NewMetrics(reg)})
	if err != nil {
		t.Fatal(err)
	}
	s := New(rs, Options{Interval: interval, Timeout: time.Second, Now: clock, Metrics: m})
	t.Cleanup(func() {
		_ = s.Close()
		_ = rs.Close()
	})
	return s, m
}

// scriptedLeases is a store with leases every 100 ms on a scripted clock
// (Redis's and the leases') starting at startUS, its refiller stopped so
// that the test runs its passes itself.
func scriptedLeases(t *testing.T, srv *redistest.Server, startUS int64) (*Store, *Metrics, *atomic.Int64) {
	t.Helper()
	return scriptedLeasesEvery(t, srv, startUS, 100*time.Millisecond)
}

// scriptedLeasesEvery is scriptedLeases with leases every interval.
func scriptedLeasesEvery(t *testing.T, srv *redistest.Server, startUS int64, interval time.Duration) (*Store, *Metrics, *atomic.Int64) {
	t.Helper()
	clock := new(atomic.Int64)
	clock.Store(startUS)
	s, m := leaseStore(t, srv, interval, func() time.Time { return time.UnixMicro(clock.Load()) })
	manual(s)
	return s, m, clock
}

// manual stops s's refiller, so that a test runs its passes itself.
func manual(s *Store) {
	close(s.leaseStop)
	s.leaseWG.Wait()
	s.leaseStop = make(chan struct{})
	s.leaseWG.Go(func() { <-s.leaseStop })
}

func hits(m *Metrics, what string) uint64 {
	return uint64(testutil.ToFloat64(m.LeaseHits.WithLabelValues(what)))
}

func locals(m *Metrics) uint64 {
	return uint64(testutil.ToFloat64(m.LeaseDecisions.WithLabelValues("local")))
}

var leaseRules = []limit.Check{
	{Limit: 100, WindowUS: 3600e6, Lease: true},
	{Limit: 100, WindowUS: 3600e6, Algorithm: limit.SlidingWindow, Lease: true},
	{Limit: 100, WindowUS: 3600e6, Algorithm: limit.TokenBucket, Lease: true},
}

// TestLeaseFleetNeverExceeds: three instances share a leased counter of
// limit 100 and get 200 requests each, spread over time so that grants
// are taken: together they admit exactly 100, a good part of them decided
// in process, on each algorithm.
func TestLeaseFleetNeverExceeds(t *testing.T) {
	redistest.AwayFromHourEnd(10 * time.Second) // the counters are per hour
	srv := redistest.Start(t)
	for ri, rule := range leaseRules {
		t.Run(rule.Algorithm.String(), func(t *testing.T) {
			var fleet []*Store
			var ms []*Metrics
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
			// 28 to 63 of the 100 in runs on a busy 2-core machine (the
			// grants follow the measured rate, which the scheduler
			// shapes); none without grants.
			if local < 10 {
				t.Errorf("%d requests decided in process; the test wants grants in use", local)
			}
		})
	}
}

// TestLeaseRollover: hits granted in a window are never used in the
// next; they are counted lost, and the next window admits its limit.
func TestLeaseRollover(t *testing.T) {
	c := limit.Check{Key: "roll", Limit: 1000, WindowUS: 60e6, Hits: 1, Lease: true}
	s, m, clock, ask := grantNearWindowEnd(t, c)
	held := s.leases.entries[c.Key].avail
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
	s, _, _ := scriptedLeases(t, srv, time.Now().UnixMicro())
	leased := limit.Check{Key: "mix:l", Limit: 1000, WindowUS: 3600e6, Hits: 1, Lease: true}
	exact := limit.Check{Key: "mix:e", Limit: 1, WindowUS: 3600e6, Hits: 1}
	if _, err := s.Evaluate(context.Background(), []limit.Check{leased}); err != nil {
		t.Fatal(err)
	}
	s.leases.entries[leased.Key].Rate = 5000
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
// exactly what one without admits for fixed windows, and for the others
// (one descriptor per request) admits as many hits, give or take the
// hits it reports lost or given back.
//
// Time is slowed down scale times (windows, steps, the lease interval
// and rates alike): Redis expires a key on its own clock, by the TTL set
// from the scripted one, so a window must outlast the real time its
// requests take on a starved machine (a 10 s window expired mid-window
// under STARVE=4 and the leased key started afresh).
func TestLeaseDifferential(t *testing.T) {
	const scale = 60
	srv := redistest.Start(t)
	for run, algo := range []limit.Algorithm{limit.FixedWindow, limit.SlidingWindow, limit.TokenBucket} {
		t.Run(algo.String(), func(t *testing.T) {
			// A fixed start, so that a failure repeats (keys of their own:
			// the counters of an earlier run would be in the future).
			leased, m, clock := scriptedLeasesEvery(t, srv, 1_800_000_000_000_000+int64(run)*3_700_000_000*scale, scale*100*time.Millisecond)
			plain, _ := leaseStore(t, srv, -1, func() time.Time { return time.UnixMicro(clock.Load()) })
			rng := rand.New(rand.NewPCG(uint64(algo), 9))
			rules := []limit.Check{{Limit: 50, WindowUS: scale * 1e6}, {Limit: 300, WindowUS: scale * 10e6}, {Limit: 7, WindowUS: scale * 2e6}}
			differ := 0
			var hitsLeased, hitsPlain int64 // admitted hits
			for i := range 6000 {
				clock.Add(scale * rng.Int64N(3000))
				var req []limit.Check
				// Two descriptors and several hits only on fixed windows:
				// elsewhere a hit lost at a window's end moves later
				// decisions, and a second counter in the request, or a
				// request of three hits refused for one, would carry the
				// move further than the hits lost.
				n, most := 1+rng.IntN(2), 3
				if algo != limit.FixedWindow {
					n, most = 1, 1
				}
				for j := range n {
					ri := rng.IntN(len(rules))
					if j == 1 && req[0].Key == fmt.Sprintf("d%v:%d", algo, ri) {
						continue
					}
					c := rules[ri]
					c.Algorithm, c.Key, c.Lease = algo, fmt.Sprintf("d%v:%d", algo, ri), true
					c.Hits = uint64(1 + rng.IntN(most))
					if rng.IntN(10) == 0 {
						c.Refund = true
					}
					req = append(req, c)
				}
				if rng.IntN(40) == 0 {
					leased.leases.mu.Lock()
					for _, g := range leased.leases.entries {
						g.Rate = float64(200+rng.IntN(2000)) / scale
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
				hitsLeased += admittedHits(req, a)
				hitsPlain += admittedHits(other, b)
				if admittedAll(req, a) != admittedAll(other, b) {
					differ++
					if algo == limit.FixedWindow {
						t.Fatalf("request %d %+v: leased %+v, plain %+v", i, req, a, b)
					}
				}
			}
			leased.leases.pass(false)
			// A hit lost at a window's end still weighs in the next
			// sliding estimate, and a held token is back in the bucket
			// only later: each may move several decisions, never the
			// hits admitted by more than itself.
			lost := int64(hits(m, "lost") + hits(m, "given_back"))
			if d := hitsPlain - hitsLeased; d > lost || d < -lost {
				t.Errorf("%d hits admitted with leases, %d without: they differ by more than the %d lost or given back", hitsLeased, hitsPlain, lost)
			}
			if locals(m) == 0 {
				t.Error("no request decided in process: the test wants grants in use")
			}
			t.Logf("%s: %d decisions differ, admitted hits %d leased, %d plain; lost %d, given back %d, local %d", algo, differ,
				hitsLeased, hitsPlain, hits(m, "lost"), hits(m, "given_back"), locals(m))
		})
	}
}

// admittedHits is the hits an admitted request consumed.
func admittedHits(checks []limit.Check, res []limit.Result) int64 {
	if !admittedAll(checks, res) {
		return 0
	}
	var n int64
	for _, c := range checks {
		if !c.Refund {
			n += int64(c.Hits)
		}
	}
	return n
}

func admittedAll(checks []limit.Check, res []limit.Result) bool {
	for i := range checks {
		if res[i].Over && !checks[i].NoVeto && !checks[i].Refund {
			return false
		}
	}
	return true
}
