package redisstore_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/ratelimitd/ratelimitd/internal/limit"
	"github.com/ratelimitd/ratelimitd/internal/redisstore"
	"github.com/ratelimitd/ratelimitd/internal/redisstore/redistest"
)

// TestExpiredCallNotSent: a call whose deadline passes while it waits
// behind a batch in flight (Redis stalled) is answered with the
// deadline's error and never sent afterwards, not even in the next batch
// beside a live call: its hits are not consumed once Redis answers
// again, after its caller was answered by the failure policy.
func TestExpiredCallNotSent(t *testing.T) {
	srv := redistest.Start(t)
	m := redisstore.NewMetrics(prometheus.NewRegistry())
	s, err := redisstore.New(redisstore.Options{URL: srv.URL(), Timeout: 10 * time.Second, Dispatchers: 1, Metrics: m})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	ctx := context.Background()
	check := func(key string, hits uint64) limit.Check {
		return limit.Check{Key: key, Limit: 100, WindowUS: 3600e6, Hits: hits}
	}
	if _, err := s.Evaluate(ctx, []limit.Check{check("warm", 1)}); err != nil {
		t.Fatal(err)
	}
	srv.Pause()
	resumed := false
	defer func() {
		if !resumed {
			srv.Resume()
		}
	}()
	first := make(chan error, 1)
	go func() {
		_, err := s.Evaluate(ctx, []limit.Check{check("first", 1)})
		first <- err
	}()
	// The first call's batch is out (its dispatcher waits on the stalled
	// Redis) before the second queues behind it, however slow the
	// machine; the second's caller stops waiting at its deadline.
	for batches(t, m) < 2 {
		time.Sleep(time.Millisecond)
	}
	short, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	if _, err := s.Evaluate(short, []limit.Check{check("expired", 5)}); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("the call behind the stall: %v, want its deadline's error", err)
	}
	// A live call queued after it: the next batch holds both, and lasts
	// to the live one's deadline, so only the dispatcher's own check
	// keeps the expired call out of it.
	third := make(chan error, 1)
	go func() {
		_, err := s.Evaluate(ctx, []limit.Check{check("live", 1)})
		third <- err
	}()
	for s.Queued() < 2 {
		time.Sleep(time.Millisecond)
	}
	srv.Resume()
	resumed = true
	for _, c := range []chan error{first, third} {
		if err := <-c; err != nil {
			t.Fatalf("a call over the stall: %v", err)
		}
	}
	res, err := s.Evaluate(ctx, []limit.Check{check("expired", 0)})
	if err != nil {
		t.Fatal(err)
	}
	if res[0].Remaining != 100 {
		t.Fatalf("the expired call's counter: %d of 100 left; its hits were sent after its caller had gone", res[0].Remaining)
	}
}

// batches is how many batches the store has taken to send.
func batches(t *testing.T, m *redisstore.Metrics) uint64 {
	t.Helper()
	var out dto.Metric
	if err := m.BatchSize.Write(&out); err != nil {
		t.Fatal(err)
	}
	return out.GetHistogram().GetSampleCount()
}
