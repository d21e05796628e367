// Package tracing exports OpenTelemetry traces of ratelimitd's decisions:
// a span per ShouldRateLimit call (gRPC or /json), child of the trace the
// caller sent (W3C traceparent, or B3 as Envoy's Zipkin tracer sends it),
// with the Redis round trip its request rode as a child span. Spans leave
// through a bounded queue to an OTLP exporter (gRPC or HTTP); a collector
// that is slow or gone loses spans, counted, and never slows a decision.
package tracing

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/ratelimitd/ratelimitd/internal/fielderr"

	"go.opentelemetry.io/contrib/propagators/b3"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.37.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/ratelimitd/ratelimitd/internal/lograte"
)

// Defaults of [Options].
const (
	DefaultServiceName = "ratelimitd"
	DefaultQueueSize   = 2048
	// exportBatch and exportEvery bound what one export carries and how
	// long a span waits for it.
	exportBatch   = 512
	exportEvery   = time.Second
	exportTimeout = 5 * time.Second
)

// Options configures [New].
type Options struct {
	// Endpoint is the collector: host:port (plaintext) or a URL
	// (http://, https://; for HTTP its path, default /v1/traces).
	Endpoint string
	// Protocol is "grpc" (the default; OTLP's port 4317) or "http"
	// (protobuf over HTTP; port 4318).
	Protocol string
	// SamplingRate is the share of traces started here that are kept,
	// 0 to 1; a caller's sampling decision is always followed.
	SamplingRate float64
	// ServiceName, ServiceNamespace and InstanceID describe this process
	// in every span's resource; OTEL_RESOURCE_ATTRIBUTES and
	// OTEL_SERVICE_NAME add to and override them.
	ServiceName, ServiceNamespace, InstanceID, Version string
	// QueueSize bounds the spans waiting for export; zero means
	// DefaultQueueSize. Spans past it are dropped and counted.
	QueueSize int
	// OnDrop is called with the number of spans lost: the queue full, or
	// an export that failed.
	OnDrop func(reason string, n int)
	// Logger receives export failures, at most one line a minute.
	Logger *slog.Logger
	// Exporter, when set, replaces the OTLP exporter (benchmarks, tests).
	Exporter sdktrace.SpanExporter
}

// Validate refuses options no pipeline can run with, naming the field.
func (o Options) Validate() error {
	switch {
	case o.Protocol != "" && o.Protocol != "grpc" && o.Protocol != "http":
		return fielderr.Errorf("tracing", "Protocol", "%q: want grpc or http", o.Protocol)
	case o.SamplingRate < 0 || o.SamplingRate > 1:
		return fielderr.Errorf("tracing", "SamplingRate", "%v: want from 0 to 1", o.SamplingRate)
	case o.QueueSize < 0:
		return fielderr.Errorf("tracing", "QueueSize", "%d: want positive", o.QueueSize)
	}
	return nil
}

// Tracing is a running trace pipeline. A nil *Tracing traces nothing.
type Tracing struct {
	provider   *sdktrace.TracerProvider
	tracer     trace.Tracer
	propagator propagation.TextMapPropagator
}

// New builds the exporter and the pipeline; it connects lazily, so a
// collector that is down is not a startup error.
func New(ctx context.Context, o Options) (*Tracing, error) {
	if o.QueueSize <= 0 {
		o.QueueSize = DefaultQueueSize
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.ServiceName == "" {
		o.ServiceName = DefaultServiceName
	}
	if o.SamplingRate < 0 || o.SamplingRate > 1 {
		return nil, fmt.Errorf("tracing: sampling rate %v is not between 0 and 1", o.SamplingRate)
	}
	exp := o.Exporter
	if exp == nil {
		var err error
		if exp, err = exporter(ctx, o); err != nil {
			return nil, err
		}
	}
	attrs := []attribute.KeyValue{semconv.ServiceName(o.ServiceName)}
	if o.ServiceNamespace != "" {
		attrs = append(attrs, semconv.ServiceNamespace(o.ServiceNamespace))
	}
	if o.InstanceID != "" {
		attrs = append(attrs, semconv.ServiceInstanceID(o.InstanceID))
	}
	if o.Version != "" {
		attrs = append(attrs, semconv.ServiceVersion(o.Version))
	}
	res, err := resource.New(ctx, resource.WithAttributes(attrs...), resource.WithFromEnv())
	if err != nil && !errors.Is(err, resource.ErrPartialResource) {
		return nil, fmt.Errorf("tracing: resource: %w", err)
	}
	tp := sdktrace.NewTracerProvider(
		sdktrace.WithResource(res),
		sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.TraceIDRatioBased(o.SamplingRate))),
		sdktrace.WithSpanProcessor(newQueue(exp, o)),
	)
	return &Tracing{
		provider: tp,
		tracer:   tp.Tracer("github.com/ratelimitd/ratelimitd"),
		// Envoy sends W3C trace context with OpenTelemetry tracing, and B3
		// (one header or several) with Zipkin's.
		propagator: propagation.NewCompositeTextMapPropagator(propagation.TraceContext{},
			b3.New(b3.WithInjectEncoding(b3.B3MultipleHeader|b3.B3SingleHeader))),
	}, nil
}

// exporter makes the OTLP exporter for o's endpoint and protocol; retries
// stay short: the queue, not the exporter, absorbs an outage.
func exporter(ctx context.Context, o Options) (sdktrace.SpanExporter, error) {
	url := strings.Contains(o.Endpoint, "://")
	switch strings.ToLower(o.Protocol) {
	case "", "grpc":
		opts := []otlptracegrpc.Option{otlptracegrpc.WithTimeout(exportTimeout),
			otlptracegrpc.WithRetry(otlptracegrpc.RetryConfig{Enabled: true, InitialInterval: 500 * time.Millisecond, MaxInterval: 2 * time.Second, MaxElapsedTime: 5 * time.Second})}
		switch {
		case url:
			opts = append(opts, otlptracegrpc.WithEndpointURL(o.Endpoint))
		case o.Endpoint != "":
			opts = append(opts, otlptracegrpc.WithEndpoint(o.Endpoint), otlptracegrpc.WithInsecure())
		}
		return otlptracegrpc.New(ctx, opts...)
	case "http", "http/protobuf":
		opts := []otlptracehttp.Option{otlptracehttp.WithTimeout(exportTimeout),
			otlptracehttp.WithRetry(otlptracehttp.RetryConfig{Enabled: true, InitialInterval: 500 * time.Millisecond, MaxInterval: 2 * time.Second, MaxElapsedTime: 5 * time.Second})}
		switch {
		case url:
			// A base URL, as OTEL_EXPORTER_OTLP_ENDPOINT gives one, gets
			// the traces path the SDK appends to it.
			u := o.Endpoint
			if _, rest, _ := strings.Cut(u, "://"); !strings.Contains(strings.TrimSuffix(rest, "/"), "/") {
				u = strings.TrimSuffix(u, "/") + "/v1/traces"
			}
			opts = append(opts, otlptracehttp.WithEndpointURL(u))
		case o.Endpoint != "":
			opts = append(opts, otlptracehttp.WithEndpoint(o.Endpoint), otlptracehttp.WithInsecure())
		}
		return otlptracehttp.New(ctx, opts...)
	}
	return nil, fmt.Errorf("tracing: protocol %q: want grpc or http", o.Protocol)
}

// Shutdown exports what is queued, within ctx, and stops.
func (t *Tracing) Shutdown(ctx context.Context) error {
	if t == nil {
		return nil
	}
	return t.provider.Shutdown(ctx)
}

// Tracer is the tracer spans start from; nil when t is.
func (t *Tracing) Tracer() trace.Tracer {
	if t == nil {
		return nil
	}
	return t.tracer
}

// Start begins a server span named name, child of the trace context that
// carrier holds (none, or a malformed one: a new trace). On a nil
// Tracing it begins nothing: the span is the context's, a no-op one
// when it has none.
func (t *Tracing) Start(ctx context.Context, name string, carrier propagation.TextMapCarrier) (context.Context, trace.Span) {
	if t == nil {
		return ctx, trace.SpanFromContext(ctx)
	}
	ctx = t.propagator.Extract(ctx, carrier)
	return t.tracer.Start(ctx, name, trace.WithSpanKind(trace.SpanKindServer))
}

// queue is a span processor with a bounded queue: OnEnd never waits, and
// what does not fit is dropped and counted.
type queue struct {
	exp     sdktrace.SpanExporter
	spans   chan sdktrace.ReadOnlySpan
	onDrop  func(string, int)
	log     *slog.Logger
	lastLog lograte.Limiter
	stop    chan struct{}
	flush   chan chan struct{}
	done    sync.WaitGroup
	once    sync.Once
	// exports bounds every export; abandon cancels the one in flight
	// when a shutdown's deadline passes, so nothing outlives it.
	exports context.Context
	abandon context.CancelFunc
}

func newQueue(exp sdktrace.SpanExporter, o Options) *queue {
	q := &queue{exp: exp, spans: make(chan sdktrace.ReadOnlySpan, o.QueueSize), onDrop: o.OnDrop, log: o.Logger,
		stop: make(chan struct{}), flush: make(chan chan struct{})}
	q.exports, q.abandon = context.WithCancel(context.Background())
	if q.onDrop == nil {
		q.onDrop = func(string, int) {}
	}
	q.done.Go(q.run)
	return q
}

func (q *queue) OnStart(context.Context, sdktrace.ReadWriteSpan) {}

func (q *queue) OnEnd(s sdktrace.ReadOnlySpan) {
	if !s.SpanContext().IsSampled() {
		return
	}
	select {
	case q.spans <- s:
	default:
		q.onDrop("queue_full", 1)
	}
}

func (q *queue) run() {
	batch := make([]sdktrace.ReadOnlySpan, 0, exportBatch)
	tick := time.NewTicker(exportEvery)
	defer tick.Stop()
	send := func() {
		if len(batch) == 0 {
			return
		}
		ctx, cancel := context.WithTimeout(q.exports, exportTimeout+time.Second)
		err := q.exp.ExportSpans(ctx, batch)
		cancel()
		if err != nil {
			q.onDrop("export_failed", len(batch))
			if q.lastLog.Allow(time.Now(), time.Minute) {
				q.log.Warn("trace export failed; spans dropped (logged at most once a minute)", "spans", len(batch), "err", err)
			}
		}
		clear(batch)
		batch = batch[:0]
	}
	for {
		select {
		case s := <-q.spans:
			if batch = append(batch, s); len(batch) == exportBatch {
				send()
			}
		case <-tick.C:
			send()
		case ch := <-q.flush:
			q.drain(&batch, send)
			close(ch)
		case <-q.stop:
			q.drain(&batch, send)
			return
		}
	}
}

// drain exports what is queued now.
func (q *queue) drain(batch *[]sdktrace.ReadOnlySpan, send func()) {
	for {
		select {
		case s := <-q.spans:
			if *batch = append(*batch, s); len(*batch) == exportBatch {
				send()
			}
		default:
			send()
			return
		}
	}
}

func (q *queue) ForceFlush(ctx context.Context) error {
	ch := make(chan struct{})
	select {
	case q.flush <- ch:
	case <-q.stop:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (q *queue) Shutdown(ctx context.Context) error {
	q.once.Do(func() { close(q.stop) })
	wait := make(chan struct{})
	go func() { q.done.Wait(); close(wait) }()
	select {
	case <-wait:
	case <-ctx.Done():
		// Past the deadline (a collector that does not answer): the
		// export in flight and what is queued are dropped, and the
		// exporter's connection closed, so that no goroutine of the
		// queue outlives the shutdown.
		q.abandon()
		<-wait
		_ = q.exp.Shutdown(context.Background())
		return ctx.Err()
	}
	defer q.abandon()
	return q.exp.Shutdown(ctx)
}
