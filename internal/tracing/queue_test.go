package tracing

import (
	"context"
	"errors"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// stuckExporter is a collector that never answers: an export returns
// only when its context ends.
type stuckExporter struct {
	exporting chan struct{}
	shutdown  atomic.Bool
}

func (e *stuckExporter) ExportSpans(ctx context.Context, _ []sdktrace.ReadOnlySpan) error {
	select {
	case e.exporting <- struct{}{}:
	default:
	}
	<-ctx.Done()
	return ctx.Err()
}

func (e *stuckExporter) Shutdown(context.Context) error { e.shutdown.Store(true); return nil }

// TestShutdownPastDeadlineLeavesNothing: a shutdown whose deadline passes
// while an export waits on a collector that does not answer returns at
// its deadline with the export abandoned, the queue's goroutine ended and
// the exporter shut (goroutines left behind were found by goleak on a busy
// machine, where the deadline passed first).
func TestShutdownPastDeadlineLeavesNothing(t *testing.T) {
	exp := &stuckExporter{exporting: make(chan struct{}, 1)}
	q := newQueue(exp, Options{QueueSize: 4, Logger: slog.New(slog.DiscardHandler)})
	q.spans <- nil
	go func() { _ = q.ForceFlush(context.Background()) }()
	select {
	case <-exp.exporting:
	case <-time.After(10 * time.Second):
		t.Fatal("no export began")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	start := time.Now()
	if err := q.Shutdown(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Shutdown: %v, want its deadline", err)
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Errorf("Shutdown took %v past a 100 ms deadline", d)
	}
	if !exp.shutdown.Load() {
		t.Error("the exporter was not shut down")
	}
	done := make(chan struct{})
	go func() { q.done.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(time.Second):
		t.Fatal("the queue's goroutine outlived the shutdown")
	}
}
