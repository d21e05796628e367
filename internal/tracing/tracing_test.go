package tracing_test

import (
	"context"
	"testing"

	"go.opentelemetry.io/otel/propagation"

	"github.com/ratelimitd/ratelimitd/internal/tracing"
)

// TestNilTracesNothing: a nil Tracing is tracing off: Start returns the
// context as it came and a span that records nothing, Tracer a nil
// tracer, Shutdown nothing to do.
func TestNilTracesNothing(t *testing.T) {
	var tr *tracing.Tracing
	ctx := context.Background()
	got, span := tr.Start(ctx, "ShouldRateLimit", propagation.MapCarrier{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"})
	if got != ctx {
		t.Error("Start on nil changed the context")
	}
	if span.IsRecording() || span.SpanContext().IsValid() {
		t.Errorf("Start on nil began a span: %+v", span.SpanContext())
	}
	span.End()
	if tr.Tracer() != nil {
		t.Error("Tracer on nil is not nil")
	}
	if err := tr.Shutdown(ctx); err != nil {
		t.Errorf("Shutdown on nil: %v", err)
	}
}
