package redisstore_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/ratelimitd/ratelimitd/internal/limit"
	"github.com/ratelimitd/ratelimitd/internal/metrics"
	"github.com/ratelimitd/ratelimitd/internal/redisstore"
	"github.com/ratelimitd/ratelimitd/internal/redistest"
)

var hourCheck = []limit.Check{{Key: "k", Limit: 1000, WindowUS: 3600e6, Hits: 1}}

// TestBreakerKillRestart kills Redis: after the threshold the breaker
// answers at once; Redis restarted on the same port closes it by itself,
// and no goroutine is left behind.
func TestBreakerKillRestart(t *testing.T) {
	srv := redistest.Start(t)
	m := metrics.New("test")
	goroutines := runtime.NumGoroutine()
	s, err := redisstore.New(redisstore.Options{URL: srv.URL(), Timeout: 50 * time.Millisecond,
		BreakerFailures: 3, ProbeInterval: 50 * time.Millisecond, Metrics: m})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := s.Evaluate(ctx, hourCheck); err != nil {
		t.Fatal(err)
	}
	srv.Kill()
	for i := range 3 {
		start := time.Now()
		_, err := s.Evaluate(ctx, hourCheck)
		if !errors.Is(err, redisstore.ErrUnavailable) || time.Since(start) > time.Second {
			t.Fatalf("call %d with Redis down: %v after %v", i, err, time.Since(start))
		}
	}
	if !s.BreakerOpen() {
		t.Fatal("breaker still closed after 3 connection errors")
	}
	// Open: every call fails at once. The median of 21 calls is taken so
	// that a GC pause under the race detector cannot fail the test.
	var took []time.Duration
	for range 21 {
		start := time.Now()
		_, err = s.Evaluate(ctx, hourCheck)
		took = append(took, time.Since(start))
		if !errors.Is(err, redisstore.ErrBreakerOpen) {
			t.Fatalf("open breaker: %v, want ErrBreakerOpen", err)
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

// TestPausedRedisBounded freezes Redis: each call ends by the timeout, the
// breaker opens, and after SIGCONT it closes again.
func TestPausedRedisBounded(t *testing.T) {
	srv := redistest.Start(t)
	s, err := redisstore.New(redisstore.Options{URL: srv.URL(), Timeout: 30 * time.Millisecond, BreakerFailures: 3, ProbeInterval: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	s.Evaluate(ctx, hourCheck)
	srv.Pause()
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			start := time.Now()
			_, err := s.Evaluate(ctx, hourCheck)
			if err == nil || time.Since(start) > 500*time.Millisecond {
				t.Errorf("paused Redis: %v after %v", err, time.Since(start))
			}
		})
	}
	wg.Wait()
	if !s.BreakerOpen() {
		t.Error("breaker closed while Redis is paused")
	}
	srv.Resume()
	deadline := time.Now().Add(2 * time.Second)
	for s.BreakerOpen() && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if _, err := s.Evaluate(ctx, hourCheck); err != nil {
		t.Errorf("2 s after SIGCONT: %v", err)
	}
}

// TestNoReplicas: with min-replicas-to-write and no replica Redis refuses
// the write; the store reports it as unavailable, class noreplicas, and
// does not trip the breaker (Redis answered at once).
func TestNoReplicas(t *testing.T) {
	srv := redistest.Start(t, "--min-replicas-to-write", "1")
	m := metrics.New("test")
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
	m := metrics.New("test")
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
