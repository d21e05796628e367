package service_test

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"testing"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/ratelimitd/ratelimitd/internal/incumbentstats"
	"github.com/ratelimitd/ratelimitd/internal/memstore"
	"github.com/ratelimitd/ratelimitd/internal/overlimitcache"
	"github.com/ratelimitd/ratelimitd/internal/record"
	"github.com/ratelimitd/ratelimitd/internal/service"
	"github.com/ratelimitd/ratelimitd/internal/tracing"
)

// BenchmarkShouldRateLimit measures the service's own cost per request on
// the in-memory store (the Redis round trip is the load tool's business):
// matching, planning, keys, the store decision and the response.
//
//	go test -run XXX -bench ShouldRateLimit -benchmem ./internal/service/
func BenchmarkShouldRateLimit(b *testing.B) {
	snap := parseRules(b, "domain: web\ndescriptors:\n  - key: d0\n    rate_limit: {unit: hour, requests_per_unit: 1000000000}\n  - key: d1\n    rate_limit: {unit: hour, requests_per_unit: 1000000000}\n  - key: d2\n    rate_limit: {unit: hour, requests_per_unit: 1000000000}\n  - key: d3\n    rate_limit: {unit: hour, requests_per_unit: 1000000000}\n  - key: over\n    rate_limit: {unit: hour, requests_per_unit: 0}\n")
	reqs := func(descs int, key string) []*rlsv3.RateLimitRequest {
		out := make([]*rlsv3.RateLimitRequest, 1024)
		for i := range out {
			r := &rlsv3.RateLimitRequest{Domain: "web"}
			for d := range descs {
				k := key
				if k == "" {
					k = "d" + strconv.Itoa(d)
				}
				r.Descriptors = append(r.Descriptors, &rlcommon.RateLimitDescriptor{Entries: []*rlcommon.RateLimitDescriptor_Entry{{Key: k, Value: strconv.Itoa(i)}}})
			}
			out[i] = r
		}
		return out
	}
	for _, bc := range []struct {
		name string
		reqs []*rlsv3.RateLimitRequest
	}{
		{"descriptors=1", reqs(1, "")},
		{"descriptors=4", reqs(4, "")},
		{"cache_hit", reqs(1, "over")},
	} {
		b.Run(bc.name, func(b *testing.B) {
			s := service.New(snap, memstore.New(memstore.Options{}), overlimitcache.New(1<<20), service.Options{})
			ctx := context.Background()
			for _, r := range bc.reqs { // warm: the over key enters the cache
				s.ShouldRateLimit(ctx, r)
			}
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; b.Loop(); i++ {
				if _, err := s.ShouldRateLimit(ctx, bc.reqs[i%len(bc.reqs)]); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkIncumbentStats is the cost of counting envoyproxy/ratelimit's
// stats on each decision: the same request with the stats off, and with
// statsd (UDP, to a socket nobody reads) and the Prometheus sink on.
//
//	go test -run XXX -bench IncumbentStats -benchmem ./internal/service/
func BenchmarkIncumbentStats(b *testing.B) {
	snap := parseRules(b, "domain: web\ndescriptors:\n  - key: d0\n    rate_limit: {unit: hour, requests_per_unit: 1000000000}\n")
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer pc.Close()
	req := &rlsv3.RateLimitRequest{Domain: "web", Descriptors: []*rlcommon.RateLimitDescriptor{{Entries: []*rlcommon.RateLimitDescriptor_Entry{{Key: "d0", Value: "v"}}}}}
	for _, on := range []bool{false, true} {
		b.Run(fmt.Sprintf("stats=%v", on), func(b *testing.B) {
			var compat *incumbentstats.Stats
			if on {
				if compat, err = incumbentstats.New(context.Background(), incumbentstats.Options{StatsdAddr: pc.LocalAddr().String(), StatsdProtocol: "udp", Prometheus: true}); err != nil {
					b.Fatal(err)
				}
				defer compat.Close()
			}
			s := service.New(snap, memstore.New(memstore.Options{}), nil, service.Options{Recorders: []record.Recorder{incumbentstats.NewRecorder(compat)}})
			ctx := context.Background()
			b.ReportAllocs()
			for b.Loop() {
				if _, err := s.ShouldRateLimit(ctx, req); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// discard is a span exporter that keeps nothing.
type discard struct{}

func (discard) ExportSpans(context.Context, []sdktrace.ReadOnlySpan) error { return nil }
func (discard) Shutdown(context.Context) error                             { return nil }

// BenchmarkTracing is the cost of tracing a decision as the gRPC server
// does (extract the caller's context, a span around the decision, its
// attributes): off (no tracing configured), and at 1 % and 100 %
// sampling of traces that start here.
//
//	go test -run XXX -bench Tracing -benchmem ./internal/service/
func BenchmarkTracing(b *testing.B) {
	snap := parseRules(b, "domain: web\ndescriptors:\n  - key: d0\n    rate_limit: {unit: hour, requests_per_unit: 1000000000}\n")
	req := &rlsv3.RateLimitRequest{Domain: "web", Descriptors: []*rlcommon.RateLimitDescriptor{{Entries: []*rlcommon.RateLimitDescriptor_Entry{{Key: "d0", Value: "v"}}}}}
	for _, rate := range []float64{-1, 0.01, 1} {
		name := fmt.Sprintf("sampling=%v", rate)
		if rate < 0 {
			name = "off"
		}
		b.Run(name, func(b *testing.B) {
			var tr *tracing.Tracing
			if rate >= 0 {
				var err error
				if tr, err = tracing.New(context.Background(), tracing.Options{SamplingRate: rate, Exporter: discard{}}); err != nil {
					b.Fatal(err)
				}
				defer tr.Shutdown(context.Background())
			}
			s := service.New(snap, memstore.New(memstore.Options{}), nil, service.Options{})
			carrier := propagation.HeaderCarrier{}
			b.ReportAllocs()
			for b.Loop() {
				ctx := context.Background()
				var span trace.Span
				if tr != nil {
					ctx, span = tr.Start(ctx, "ShouldRateLimit", carrier)
				}
				if _, err := s.ShouldRateLimit(ctx, req); err != nil {
					b.Fatal(err)
				}
				if span != nil {
					span.End()
				}
			}
		})
	}
}
