package lease

// Leases through stalls, give-backs, expiry, refunds and cold counters.

import (
	"context"
	"fmt"
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
	// Before the stalls, a first take that outlived its deadline on a
	// crowded machine is answered by the policy, as it should be.
	if n := failed.Load() - warm; n != 0 {
		t.Errorf("%d requests answered by failure policy through the stalls; want none while grants last", n)
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
		s.leases.entries[c.Key].Rate = 5000
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
	g.Rate = 5000
	s.leases.pass(false)
	first := g.avail
	clock.Add(250e3) // past two intervals; the key stays in use
	if _, err := s.Evaluate(context.Background(), []limit.Check{c}); err != nil {
		t.Fatal(err)
	}
	g.Rate = 5000
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
		s.leases.entries[c.Key].Rate = 5000
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
	s.leases.entries[c.Key].Rate = 2000
	clock.Add(900e3)
	s.leases.pass(false)
	if held := s.leases.entries[c.Key].avail; held < 2 {
		t.Fatalf("no grant taken: %d held", held)
	}
	return s, m, clock, ask
}
