package redisstore_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"slices"
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

var hourCheck = []limit.Check{{Key: "k", Limit: 1000, WindowUS: 3600e6, Hits: 1}}

// TestBreakerKillRestart kills Redis: once round trips have failed for
// BreakerOpenAfter the breaker answers at once; Redis restarted on the
// same port closes it by itself, and no goroutine is left behind.
func TestBreakerKillRestart(t *testing.T) {
	srv := redistest.Start(t)
	m := redisstore.NewMetrics(prometheus.NewRegistry())
	goroutines := runtime.NumGoroutine()
	s, err := redisstore.New(redisstore.Options{URL: srv.URL(), Timeout: 50 * time.Millisecond,
		BreakerOpenAfter: 100 * time.Millisecond, ProbeInterval: 50 * time.Millisecond, Metrics: m})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := s.Evaluate(ctx, hourCheck); err != nil {
		t.Fatal(err)
	}
	srv.Kill()
	killed := time.Now()
	for !s.BreakerOpen() {
		start := time.Now()
		_, err := s.Evaluate(ctx, hourCheck)
		if !errors.Is(err, redisstore.ErrUnavailable) || time.Since(start) > time.Second {
			t.Fatalf("with Redis down: %v after %v", err, time.Since(start))
		}
		if time.Since(killed) > 3*time.Second {
			t.Fatal("breaker still closed 3 s after Redis died")
		}
	}
	if el := time.Since(killed); el < 100*time.Millisecond {
		t.Errorf("breaker opened %v after Redis died, before BreakerOpenAfter", el)
	}
	// Open: calls fail at once (but for a trial now and then, which meets
	// the refused connection). The median of 21 calls is taken so that a
	// GC pause under the race detector cannot fail the test.
	var took []time.Duration
	for range 21 {
		start := time.Now()
		_, err = s.Evaluate(ctx, hourCheck)
		took = append(took, time.Since(start))
		if !errors.Is(err, redisstore.ErrUnavailable) {
			t.Fatalf("open breaker: %v, want ErrUnavailable", err)
		}
	}
	slices.Sort(took)
	if took[10] > 5*time.Millisecond {
		t.Errorf("open breaker: median answer %v, want < 5ms", took[10])
	}
	srv.Restart()
	deadline := time.Now().Add(5 * time.Second)
	for s.BreakerOpen() && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	r, err := s.Evaluate(ctx, hourCheck)
	if err != nil || r[0].Used(1000) != 1 {
		t.Fatalf("after restart: %+v, %v (want count 1 on the empty Redis)", r, err)
	}
	if got := testutil.ToFloat64(m.BreakerTrips); got != 1 {
		t.Errorf("breaker trips = %v", got)
	}
	if got := testutil.ToFloat64(m.RedisErrors.WithLabelValues(redisstore.ClassConnection)); got < 3 {
		t.Errorf("connection errors = %v", got)
	}
	s.Close()
	time.Sleep(100 * time.Millisecond)
	if now := runtime.NumGoroutine(); now > goroutines+2 {
		t.Errorf("goroutines %d before, %d after Close", goroutines, now)
	}
}

// TestPausedRedisBounded freezes Redis for 2 s under steady traffic: each
// call ends by the timeout, the breaker opens within BreakerOpenAfter and
// a timeout (generously: the box is busy), answers take under 5 ms while
// it is open, and after SIGCONT decisions come from Redis again within
// 20 ms (a trial call is let through every 5 ms).
func TestPausedRedisBounded(t *testing.T) {
	srv := redistest.Start(t)
	const timeout, openAfter = 30 * time.Millisecond, 150 * time.Millisecond
	s := decidedOnce(t, redisstore.Options{URL: srv.URL(), Timeout: timeout, BreakerOpenAfter: openAfter, ProbeInterval: 50 * time.Millisecond})
	ctx := context.Background()
	type result struct {
		start, end time.Time
		err        error
	}
	var mu sync.Mutex
	var results []result
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				start := time.Now()
				_, err := s.Evaluate(ctx, hourCheck)
				end := time.Now() // not after waiting for the lock
				mu.Lock()
				results = append(results, result{start, end, err})
				mu.Unlock()
				// Steady traffic, not a flood: an open breaker answers
				// in microseconds, and millions of samples would make the
				// test measure its own slice growth.
				time.Sleep(100 * time.Microsecond)
			}
		})
	}
	time.Sleep(50 * time.Millisecond)
	paused := time.Now()
	srv.Pause()
	var opened time.Time
	for time.Since(paused) < 2*time.Second {
		if opened.IsZero() && s.BreakerOpen() {
			opened = time.Now()
		}
		time.Sleep(time.Millisecond)
	}
	srv.Resume()
	resumed := time.Now()
	// On a busy box the stopped process takes a while to run again: the
	// bound is from when Redis answers a client of its own.
	answering := srv.Client()
	for answering.Ping(ctx).Err() != nil {
	}
	answered := time.Now()
	time.Sleep(200 * time.Millisecond)
	close(stop)
	wg.Wait()
	if opened.IsZero() {
		t.Fatal("breaker never opened during a 2 s stall")
	}
	if el := opened.Sub(paused); el < openAfter || el > openAfter+timeout+500*time.Millisecond {
		t.Errorf("breaker opened %v after the stall began, want within %v + %v", el, openAfter, timeout)
	}
	var whileOpen []time.Duration
	firstOK := time.Duration(-1)
	for _, r := range results {
		if r.err != nil && r.end.Sub(r.start) > 500*time.Millisecond {
			t.Errorf("a call took %v with Redis paused", r.end.Sub(r.start))
		}
		if r.start.After(opened) && r.end.Before(resumed) && errors.Is(r.err, redisstore.ErrBreakerOpen) {
			whileOpen = append(whileOpen, r.end.Sub(r.start))
		}
		if r.err == nil && r.end.After(resumed) && (firstOK < 0 || r.end.Sub(answered) < firstOK) {
			firstOK = r.end.Sub(answered)
		}
		if r.err != nil && r.start.After(resumed.Add(250*time.Millisecond)) {
			t.Errorf("a call started %v after SIGCONT failed: %v", r.start.Sub(resumed), r.err)
		}
	}
	slices.Sort(whileOpen)
	if len(whileOpen) == 0 || whileOpen[len(whileOpen)/2] > 5*time.Millisecond {
		t.Errorf("while open: %d calls, median answer %v", len(whileOpen), whileOpen[len(whileOpen)/2])
	}
	t.Logf("breaker opened %v after the stall began; %d answers while open; Redis answering %v after SIGCONT, the store deciding %v after that",
		opened.Sub(paused).Round(time.Millisecond), len(whileOpen), answered.Sub(resumed), firstOK)
	bound := 20 * time.Millisecond
	if raceEnabled {
		bound = 250 * time.Millisecond
	}
	if firstOK < 0 || firstOK > bound {
		t.Errorf("first decision from Redis %v after Redis answered again, want within %v", firstOK, bound)
	}
}

// TestSlowRoundTripKeepsBreakerClosed: one script call made slow (Redis
// paused for 1.5 x the timeout, once) under 200 concurrent callers fails
// the requests it carried, but one slow round trip is not a dead Redis:
// the breaker stays closed, and every other request is decided by Redis.
// On a crowded machine the pause itself can last past the breaker's
// 250 ms (the test's sleep is late, or Redis is scheduled late after
// it): calls then fail for that long and the breaker rightly opens, so
// such an episode is run again (at most five, each a fresh store) and
// the assertions hold the episodes whose failed calls all began within
// 150 ms.
func TestSlowRoundTripKeepsBreakerClosed(t *testing.T) {
	srv := redistest.Start(t)
	const timeout, within = 50 * time.Millisecond, 150 * time.Millisecond
	for episode := 1; ; episode++ {
		failSpan, trips, classes := slowRoundTrip(t, srv, timeout)
		t.Logf("episode %d: outcomes by class %v; failed calls began over %v", episode, classes, failSpan)
		if failSpan >= within {
			if episode == 5 {
				t.Fatalf("five episodes failed calls for %v or more: the machine cannot pause Redis for one round trip", within)
			}
			continue
		}
		if trips != 0 {
			t.Errorf("one slow round trip opened the breaker (%v trips)", trips)
		}
		if n := classes[redisstore.ClassBreakerOpen]; n > 0 {
			t.Errorf("%d requests answered by an open breaker", n)
		}
		if classes[""] == 0 {
			t.Error("no request decided")
		}
		return
	}
}

// slowRoundTrip pauses srv for 1.5 x timeout under 200 callers of a fresh
// store, and returns the span over which the calls that failed began, the
// breaker's trips and the calls' outcomes by class.
func slowRoundTrip(t *testing.T, srv *redistest.Server, timeout time.Duration) (time.Duration, float64, map[string]int) {
	m := redisstore.NewMetrics(prometheus.NewRegistry())
	s := decidedOnce(t, redisstore.Options{URL: srv.URL(), Timeout: timeout, Metrics: m})
	defer s.Close()
	warmTrips := testutil.ToFloat64(m.BreakerTrips) // a crowded machine's first calls may trip it
	ctx := context.Background()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var mu sync.Mutex
	classes := map[string]int{}
	var firstFail, lastFail time.Time
	for i := range 200 {
		wg.Go(func() {
			check := []limit.Check{{Key: fmt.Sprint("slow", i), Limit: 1 << 30, WindowUS: 3600e6, Hits: 1}}
			for {
				select {
				case <-stop:
					return
				default:
				}
				start := time.Now()
				_, err := s.Evaluate(ctx, check)
				mu.Lock()
				classes[redisstore.Classify(err)]++
				if err != nil {
					if firstFail.IsZero() || start.Before(firstFail) {
						firstFail = start
					}
					if start.After(lastFail) {
						lastFail = start
					}
				}
				mu.Unlock()
			}
		})
	}
	time.Sleep(300 * time.Millisecond)
	srv.Pause()
	time.Sleep(timeout * 3 / 2)
	srv.Resume()
	time.Sleep(300 * time.Millisecond)
	close(stop)
	wg.Wait()
	return lastFail.Sub(firstFail), testutil.ToFloat64(m.BreakerTrips) - warmTrips, classes
}

// TestNoReplicas: with min-replicas-to-write and no replica Redis refuses
// the write; the store reports it as unavailable, class noreplicas, and
// does not trip the breaker (Redis answered at once).
func TestNoReplicas(t *testing.T) {
	srv := redistest.Start(t, "--min-replicas-to-write", "1")
	m := redisstore.NewMetrics(prometheus.NewRegistry())
	s, err := redisstore.New(redisstore.Options{URL: srv.URL(), Timeout: time.Second, BreakerFailures: 1, Metrics: m})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	_, err = s.Evaluate(context.Background(), hourCheck)
	if !errors.Is(err, redisstore.ErrUnavailable) || !strings.Contains(err.Error(), "noreplicas") {
		t.Fatalf("err = %v, want unavailable, noreplicas", err)
	}
	if got := testutil.ToFloat64(m.RedisErrors.WithLabelValues(redisstore.ClassNoReplicas)); got != 1 {
		t.Errorf("noreplicas errors = %v", got)
	}
	if s.BreakerOpen() {
		t.Error("an error reply opened the breaker")
	}
}

func TestMaxmemoryPolicyWarning(t *testing.T) {
	srv := redistest.Start(t, "--maxmemory-policy", "allkeys-lru")
	m := redisstore.NewMetrics(prometheus.NewRegistry())
	var logs syncBuf
	s, err := redisstore.New(redisstore.Options{URL: srv.URL(), Metrics: m, Logger: slog.New(slog.NewTextHandler(&logs, nil)), PolicyCheckEvery: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	deadline := time.Now().Add(5 * time.Second)
	for testutil.ToFloat64(m.MaxmemoryPolicy.WithLabelValues(srv.Addr(), "allkeys-lru")) != 1 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if got := testutil.ToFloat64(m.MaxmemoryPolicy.WithLabelValues(srv.Addr(), "allkeys-lru")); got != 1 {
		t.Fatalf("policy gauge = %v", got)
	}
	time.Sleep(200 * time.Millisecond) // several more checks: still one warning
	if n := strings.Count(logs.String(), "maxmemory-policy can evict"); n != 1 {
		t.Errorf("%d warnings, want 1:\n%s", n, logs.String())
	}
	srv.Client().ConfigSet(context.Background(), "maxmemory-policy", "noeviction")
	deadline = time.Now().Add(5 * time.Second)
	for testutil.ToFloat64(m.MaxmemoryPolicy.WithLabelValues(srv.Addr(), "noeviction")) != 1 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if testutil.CollectAndCount(m.MaxmemoryPolicy) != 1 {
		t.Errorf("the old policy is still reported")
	}
}

type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuf) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestLateAnswerReachesNoOne: calls that give up at their deadline while
// their round trip is stalled (Redis paused for 1.5 x the timeout, three
// times) are answered by their dispatcher later, when newer calls are
// waiting; each caller has a key and a limit of its own, and every answer
// it gets must be of its own counter (a remaining count between its
// limit less its attempts and its limit less its decisions), never one
// meant for a call that gave up.
func TestLateAnswerReachesNoOne(t *testing.T) {
	srv := redistest.Start(t)
	const timeout = 40 * time.Millisecond
	s := decidedOnce(t, redisstore.Options{URL: srv.URL(), Timeout: timeout, BreakerOpenAfter: time.Minute})
	ctx := context.Background()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var late, wrong, decided atomic.Int64
	for i := range 100 {
		wg.Go(func() {
			lim := uint64(i+1) * 1_000_000
			check := []limit.Check{{Key: fmt.Sprint("late", i), Limit: lim, WindowUS: 3600e6, Hits: 1}}
			var attempts, ok uint64
			for {
				select {
				case <-stop:
					return
				default:
				}
				attempts++
				r, err := s.Evaluate(ctx, check)
				if err != nil {
					late.Add(1)
					continue
				}
				ok++
				decided.Add(1)
				if rem := r[0].Remaining; rem+attempts < lim || rem+ok > lim {
					if wrong.Add(1) <= 3 {
						t.Errorf("caller %d (limit %d, %d attempts, %d decided) was answered remaining %d", i, lim, attempts, ok, rem)
					}
				}
			}
		})
	}
	for range 6 {
		time.Sleep(150 * time.Millisecond)
		srv.Pause()
		time.Sleep(timeout * 3 / 2)
		srv.Resume()
	}
	time.Sleep(150 * time.Millisecond)
	close(stop)
	wg.Wait()
	t.Logf("%d decided, %d gave up at their deadline, %d answered with another's counter", decided.Load(), late.Load(), wrong.Load())
	if late.Load() == 0 {
		t.Error("no call gave up at its deadline: the stalls tested nothing")
	}
	if decided.Load() == 0 {
		t.Error("no call decided")
	}
}

// decidedOnce returns a store on opts that has decided one request
// (Redis reached, the script loaded), closed when the test ends. The
// tests' timeouts are short: on a crowded machine the first calls (a
// dial, a script load) can miss them, so it asks until one is decided,
// for up to 20 s.
func decidedOnce(t *testing.T, opts redisstore.Options) *redisstore.Store {
	t.Helper()
	s, err := redisstore.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	deadline := time.Now().Add(20 * time.Second)
	for {
		_, err := s.Evaluate(context.Background(), hourCheck)
		if err == nil {
			return s
		}
		if time.Now().After(deadline) {
			t.Fatalf("no decision within 20 s: %v", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
