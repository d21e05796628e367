package lease

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
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
	clock := new(atomic.Int64)
	clock.Store(startUS)
	s, m := leaseStore(t, srv, 100*time.Millisecond, func() time.Time { return time.UnixMicro(clock.Load()) })
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
// exactly what one without admits for fixed windows, and for the others
// (one descriptor per request) admits as many hits, give or take the
// hits it reports lost or given back.
func TestLeaseDifferential(t *testing.T) {
	srv := redistest.Start(t)
	for run, algo := range []limit.Algorithm{limit.FixedWindow, limit.SlidingWindow, limit.TokenBucket} {
		t.Run(algo.String(), func(t *testing.T) {
			// A fixed start, so that a failure repeats (keys of their own:
			// the counters of an earlier run would be in the future).
			leased, m, clock := scriptedLeases(t, srv, 1_800_000_000_000_000+int64(run)*3_700_000_000)
			plain, _ := leaseStore(t, srv, -1, func() time.Time { return time.UnixMicro(clock.Load()) })
			rng := rand.New(rand.NewPCG(uint64(algo), 9))
			rules := []limit.Check{{Limit: 50, WindowUS: 1e6}, {Limit: 300, WindowUS: 10e6}, {Limit: 7, WindowUS: 2e6}}
			differ := 0
			var hitsLeased, hitsPlain int64 // admitted hits
			for i := range 6000 {
				clock.Add(rng.Int64N(3000))
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

// TestLeaseThroughStalls: under load on a hot leased counter, Redis is
// stopped (SIGSTOP) for 70 ms every 400 ms: the grants in hand decide
// every request meanwhile, none is answered by failure policy, and what
// is admitted stays within the limit. The control, the same traffic on a
// counter without lease, does fail: the stalls are seen.
func TestLeaseThroughStalls(t *testing.T) {
	srv := redistest.Start(t)
	reg := prometheus.NewRegistry()
	m := NewMetrics(reg)
	rs, err := redisstore.New(redisstore.Options{URL: srv.URL(), Metrics: redisstore.NewMetrics(reg)})
	if err != nil {
		t.Fatal(err)
	}
	defer rs.Close()
	s := New(rs, Options{Interval: 100 * time.Millisecond, Timeout: redisstore.DefaultTimeout, Metrics: m})
	defer s.Close()
	const limitN = 1_000_000
	c := limit.Check{Key: "stall", Limit: limitN, WindowUS: 3600e6, Hits: 1, Lease: true}
	stop := make(chan struct{})
	control := c
	control.Key, control.Lease = "stall:exact", false
	var admitted, failed, total, controlFailed atomic.Int64
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				if _, err := s.Evaluate(context.Background(), []limit.Check{control}); err != nil {
					controlFailed.Add(1)
				}
				r, err := s.Evaluate(context.Background(), []limit.Check{c})
				total.Add(1)
				switch {
				case err != nil:
					failed.Add(1)
				case !r[0].Over:
					admitted.Add(1)
				}
				time.Sleep(200 * time.Microsecond)
			}
		})
	}
	time.Sleep(500 * time.Millisecond) // grants in hand
	warm := failed.Load()
	for range 5 {
		srv.Pause()
		time.Sleep(70 * time.Millisecond)
		srv.Resume()
		time.Sleep(330 * time.Millisecond)
	}
	close(stop)
	wg.Wait()
	t.Logf("%d requests, %d admitted, %d failed (%d before the stalls), %d of the control failed; %d local, %d waited; %d granted",
		total.Load(), admitted.Load(), failed.Load(), warm, controlFailed.Load(), locals(m),
		uint64(testutil.ToFloat64(m.LeaseDecisions.WithLabelValues("waited"))), hits(m, "granted"))
	if failed.Load() != 0 {
		t.Errorf("%d requests answered by failure policy through the stalls; want none while grants last", failed.Load())
	}
	if controlFailed.Load() == 0 {
		t.Error("no request without lease failed: the stalls were not seen")
	}
	if admitted.Load() > limitN || hits(m, "granted") > limitN {
		t.Errorf("admitted %d, granted %d: over the limit", admitted.Load(), hits(m, "granted"))
	}
}

// TestLeaseGiveBack: what a grant holds unused goes back to Redis when
// its counter goes idle, and when the store closes; none of it is used
// after it left.
func TestLeaseGiveBack(t *testing.T) {
	srv := redistest.Start(t)
	var clock atomic.Int64
	clock.Store(time.Now().Truncate(time.Hour).UnixMicro() + 1e6)
	now := func() time.Time { return time.UnixMicro(clock.Load()) }
	count := func(key string) string {
		raw, _ := srv.Client().Get(context.Background(), key).Result()
		return raw
	}
	for _, closing := range []bool{false, true} {
		s, m := leaseStore(t, srv, 100*time.Millisecond, now)
		manual(s)
		c := limit.Check{Key: fmt.Sprintf("back:%t", closing), Limit: 1000, WindowUS: 3600e6, Hits: 1, Lease: true}
		ask := func() {
			if r, err := s.Evaluate(context.Background(), []limit.Check{c}); err != nil || r[0].Over {
				t.Fatalf("%+v, %v", r, err)
			}
		}
		ask() // exact: 1
		s.leases.entries[c.Key].rate = 5000
		s.leases.pass(false)
		held := s.leases.entries[c.Key].avail
		ask() // local: 2 used
		if closing {
			s.Close()
		} else {
			clock.Add(2e6) // idle, same window
			s.leases.pass(false)
			if g := s.leases.entries[c.Key]; g != nil && g.avail != 0 {
				t.Errorf("idle: %d still held after the give-back", g.avail)
			}
		}
		if back := hits(m, "given_back"); back != held-1 {
			t.Errorf("closing=%t: %d given back, want the %d unused", closing, back, held-1)
		}
		if got, want := count(c.Key), fmt.Sprintf(":%d", 2); len(got) < 2 || got[len(got)-2:] != want {
			t.Errorf("closing=%t: Redis holds %q, want the 2 hits used", closing, got)
		}
		if !closing {
			ask() // exact again, or from a new grant: never from the hits given back
			if got := count(c.Key); got[len(got)-2:] != ":3" {
				t.Errorf("after the give-back Redis holds %q, want 3 used", got)
			}
		}
	}
}

// TestLeaseBucketExpiry: a token bucket's held tokens are given back two
// intervals after they were taken, and a later grant holds only its own.
func TestLeaseBucketExpiry(t *testing.T) {
	srv := redistest.Start(t)
	s, m, clock := scriptedLeases(t, srv, time.Now().UnixMicro())
	c := limit.Check{Key: "bucket", Limit: 3600, WindowUS: 3600e6, Algorithm: limit.TokenBucket, Burst: 1000, Hits: 1, Lease: true}
	if _, err := s.Evaluate(context.Background(), []limit.Check{c}); err != nil {
		t.Fatal(err)
	}
	g := s.leases.entries[c.Key]
	g.rate = 5000
	s.leases.pass(false)
	first := g.avail
	clock.Add(250e3) // past two intervals; the key stays in use
	if _, err := s.Evaluate(context.Background(), []limit.Check{c}); err != nil {
		t.Fatal(err)
	}
	g.rate = 5000
	s.leases.pass(false) // gives the expired tokens back
	if g.avail != 0 || hits(m, "given_back") != first {
		t.Fatalf("after expiry %d held, %d given back; want 0 and %d", g.avail, hits(m, "given_back"), first)
	}
	s.leases.pass(false) // a new grant
	if granted := hits(m, "granted") - first; g.avail != granted || granted == 0 {
		t.Errorf("%d held after a new grant of %d", g.avail, granted)
	}
}

// TestLeaseRefundBounded: a refund goes back to the grant only as far as
// this process used its grants; the rest goes to Redis, whose counter
// never goes below zero. A huge refund (is_negative_hits) therefore buys
// no more than a refund without lease would: at most the limit after it.
func TestLeaseRefundBounded(t *testing.T) {
	srv := redistest.Start(t)
	s, _, _ := scriptedLeases(t, srv, time.Now().UnixMicro())
	c := limit.Check{Key: "refund", Limit: 100, WindowUS: 3600e6, Hits: 1, Lease: true}
	ask := func(c limit.Check) bool {
		r, err := s.Evaluate(context.Background(), []limit.Check{c})
		if err != nil {
			t.Fatal(err)
		}
		return !r[0].Over
	}
	for _, refund := range []uint64{1 << 32, 7} {
		c.Key = fmt.Sprintf("refund:%d", refund)
		ask(c) // 1 in Redis
		s.leases.entries[c.Key].rate = 5000
		s.leases.pass(false)
		for range 5 {
			ask(c) // 5 from the grant
		}
		back := c
		back.Hits, back.Refund = refund, true
		ask(back) // more than the 6 used: the counter is empty again
		n := 0
		for range 1000 {
			if ask(c) {
				n++
			}
		}
		if n != 100 {
			t.Errorf("%d admitted after a refund of %d hits (of 6 used), want the limit of 100", n, refund)
		}
	}
}

// TestLeaseColdCounter: a leased counter too cold to earn a grant of two
// hits is decided in Redis request by request, as without lease, and
// takes no grant.
func TestLeaseColdCounter(t *testing.T) {
	srv := redistest.Start(t)
	s, m, clock := scriptedLeases(t, srv, time.Now().Truncate(time.Hour).UnixMicro())
	c := limit.Check{Key: "cold", Limit: 1000, WindowUS: 3600e6, Hits: 1, Lease: true}
	for range 10 {
		if r, err := s.Evaluate(context.Background(), []limit.Check{c}); err != nil || r[0].Over {
			t.Fatalf("%+v, %v", r, err)
		}
		clock.Add(1e6) // one a second: 0.1 hits an interval
		s.leases.pass(false)
	}
	cold := testutil.ToFloat64(m.LeaseDecisions.WithLabelValues("cold"))
	if cold != 10 || hits(m, "granted") != 0 || locals(m) != 0 {
		t.Errorf("cold %v of 10, %d granted, %d local; want every request decided in Redis, no grant", cold, hits(m, "granted"), locals(m))
	}
	if got, _ := srv.Client().Get(context.Background(), c.Key).Result(); !strings.HasSuffix(got, ":10") {
		t.Errorf("Redis holds %q, want the 10 hits", got)
	}
}

// TestLeaseClockReadUnderLock: a request paused after it arrives and
// before it decides (here, waiting for the leases' lock while its window
// ends) decides on the clock when it decides: a grant of the window that
// ended is not used for it, and the new window admits exactly its limit,
// that request included. (A clock read before the wait used the old
// window's grant: 1,001.)
func TestLeaseClockReadUnderLock(t *testing.T) {
	c := limit.Check{Key: "paused", Limit: 1000, WindowUS: 60e6, Hits: 1, Lease: true}
	s, _, clock, ask := grantNearWindowEnd(t, c)
	s.leases.mu.Lock()
	paused := make(chan bool)
	go func() { paused <- ask() }()
	time.Sleep(200 * time.Millisecond) // it arrives, and waits for the lock
	clock.Add(100e3)                   // the next window
	s.leases.mu.Unlock()
	n := 0
	if <-paused {
		n++
	}
	for range 1500 {
		if ask() {
			n++
		}
	}
	if n != 1000 {
		t.Errorf("the next window admitted %d, the paused request included; want exactly its 1000", n)
	}
}

// grantNearWindowEnd is a scripted store whose leased counter c (of
// one-second windows) holds a grant taken 900 ms into a window, and a
// function deciding one request of c. It fails t if no grant was taken.
func grantNearWindowEnd(t *testing.T, c limit.Check) (*Store, *Metrics, *atomic.Int64, func() bool) {
	t.Helper()
	// A second before c's window ends, its start an hour's.
	s, m, clock := scriptedLeases(t, redistest.Start(t), time.Now().Truncate(time.Hour).Add(time.Hour).UnixMicro()+c.WindowUS-1e6)
	ask := func() bool {
		r, err := s.Evaluate(context.Background(), []limit.Check{c})
		if err != nil {
			t.Error(err)
			return false
		}
		return !r[0].Over
	}
	ask() // the counter is known
	s.leases.entries[c.Key].rate = 2000
	clock.Add(900e3)
	s.leases.pass(false)
	if held := s.leases.entries[c.Key].avail; held < 2 {
		t.Fatalf("no grant taken: %d held", held)
	}
	return s, m, clock, ask
}
