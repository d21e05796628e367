package service_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/internal/memstore"
	"github.com/ratelimitd/ratelimitd/internal/metrics"
	"github.com/ratelimitd/ratelimitd/internal/overlimitcache"
	"github.com/ratelimitd/ratelimitd/internal/record"
	"github.com/ratelimitd/ratelimitd/internal/service"
)

// TestCacheBlocksUntilExactReset: the local over-limit cache answers an
// exhausted counter until the counter's own reset, as the store reported
// it, and not a moment longer: 10 minutes before the end of an hourly
// window, it blocks until that end (not for an hour from now).
func TestCacheBlocksUntilExactReset(t *testing.T) {
	var clock atomic.Int64
	end := time.Now().Truncate(time.Hour).Add(3 * time.Hour)
	clock.Store(end.Add(-10 * time.Minute).UnixNano())
	now := func() time.Time { return time.Unix(0, clock.Load()) }
	st := &countingStore{Store: memstore.New(memstore.Options{Now: now})}
	s := service.New(rules(t), st, overlimitcache.New(1<<20), service.Options{Now: now})
	for range 3 {
		call(t, s, request(desc("user", "u")))
	}
	if r := call(t, s, request(desc("user", "u"))); codes(r) != "OVER_LIMIT OVER_LIMIT" {
		t.Fatalf("exhausted: %v", codes(r))
	}
	clock.Store(end.Add(-time.Second).UnixNano())
	calls := st.calls.Load()
	if r := call(t, s, request(desc("user", "u"))); codes(r) != "OVER_LIMIT OVER_LIMIT" || st.calls.Load() != calls {
		t.Fatalf("a second before the reset: %v with %d store calls, want OVER_LIMIT from the cache", codes(r), st.calls.Load()-calls)
	}
	clock.Store(end.Add(time.Second).UnixNano())
	if r := call(t, s, request(desc("user", "u"))); codes(r) != "OK OK" {
		t.Errorf("a second after the counter's reset: %v, want OK (the cache blocked past the reset)", codes(r))
	}
}

// TestNoStoreCallInsideTheMargin: when the caller's deadline is already
// within DeadlineMargin, the store is not called at all (there is no time
// to use its answer) and the request is answered by policy at once.
func TestNoStoreCallInsideTheMargin(t *testing.T) {
	st := &countingStore{Store: memstore.New(memstore.Options{})}
	m := metrics.New("test")
	s := service.New(rules(t), st, nil, service.Options{DeadlineMargin: time.Hour, Recorders: []record.Recorder{metrics.Recorder{M: m}}})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	resp, err := s.ShouldRateLimit(ctx, request(desc("user", "m")))
	if err != nil || codes(resp) != "OK OK" {
		t.Fatalf("inside the margin: %v, %v; want OK by policy", resp, err)
	}
	if n := st.calls.Load(); n != 0 {
		t.Errorf("store called %d times inside the margin", n)
	}
	if n := outcomes(t, m, service.OutcomeFailOpen); n != 1 {
		t.Errorf("fail-open = %v, want 1", n)
	}
	// Outside the margin the store decides.
	s = service.New(rules(t), st, nil, service.Options{DeadlineMargin: time.Millisecond})
	call(t, s, request(desc("user", "m")))
	if n := st.calls.Load(); n != 1 {
		t.Errorf("store called %d times outside the margin, want 1", n)
	}
}
