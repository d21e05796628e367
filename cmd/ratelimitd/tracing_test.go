package main

import (
	"bytes"
	"context"
	"encoding/hex"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	collectorpb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"

	"github.com/ratelimitd/ratelimitd/internal/redisstore/redistest"
)

// otlpReceiver is an OTLP trace collector for tests, over gRPC or HTTP:
// it keeps every span it is sent, with its resource's service.name.
type otlpReceiver struct {
	collectorpb.UnimplementedTraceServiceServer
	addr  string
	mu    sync.Mutex
	spans []receivedSpan
}

type receivedSpan struct {
	service string
	span    *tracepb.Span
}

func (r *otlpReceiver) Export(_ context.Context, req *collectorpb.ExportTraceServiceRequest) (*collectorpb.ExportTraceServiceResponse, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, rs := range req.GetResourceSpans() {
		svc := ""
		for _, a := range rs.GetResource().GetAttributes() {
			if a.GetKey() == "service.name" {
				svc = a.GetValue().GetStringValue()
			}
		}
		for _, ss := range rs.GetScopeSpans() {
			for _, sp := range ss.GetSpans() {
				r.spans = append(r.spans, receivedSpan{svc, sp})
			}
		}
	}
	return &collectorpb.ExportTraceServiceResponse{}, nil
}

func startOTLP(t *testing.T, protocol string) *otlpReceiver {
	t.Helper()
	r := &otlpReceiver{}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r.addr = lis.Addr().String()
	if protocol == "grpc" {
		srv := grpc.NewServer()
		collectorpb.RegisterTraceServiceServer(srv, r)
		go srv.Serve(lis)
		t.Cleanup(srv.Stop)
		return r
	}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/traces", func(w http.ResponseWriter, req *http.Request) {
		body, _ := io.ReadAll(req.Body)
		var in collectorpb.ExportTraceServiceRequest
		if err := proto.Unmarshal(body, &in); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		r.Export(req.Context(), &in)
		out, _ := proto.Marshal(&collectorpb.ExportTraceServiceResponse{})
		w.Header().Set("Content-Type", "application/x-protobuf")
		w.Write(out)
	})
	srv := &http.Server{Handler: mux}
	go srv.Serve(lis)
	t.Cleanup(func() { srv.Close() })
	return r
}

// find waits for a span of traceID named name.
func (r *otlpReceiver) find(t *testing.T, traceID, name string) receivedSpan {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		r.mu.Lock()
		for _, s := range r.spans {
			if hex.EncodeToString(s.span.GetTraceId()) == traceID && s.span.GetName() == name {
				r.mu.Unlock()
				return s
			}
		}
		var names []string
		for _, s := range r.spans {
			names = append(names, s.span.GetName()+" "+hex.EncodeToString(s.span.GetTraceId()))
		}
		r.mu.Unlock()
		if time.Now().After(deadline) {
			t.Fatalf("no span %q in trace %s within 20 s; got %v", name, traceID, names)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func attr(s *tracepb.Span, key string) string {
	for _, a := range s.GetAttributes() {
		if a.GetKey() == key {
			v := a.GetValue()
			if v.GetStringValue() != "" {
				return v.GetStringValue()
			}
			return fmt.Sprint(v.GetIntValue())
		}
	}
	return ""
}

const tracedRules = "domain: traced\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 100}\n"

// tracedAsk returns a function sending one ShouldRateLimit of
// tracedRules to addr, with md as its gRPC metadata (a traceparent, say).
func tracedAsk(t *testing.T, addr string) func(md ...string) error {
	client := rlsv3.NewRateLimitServiceClient(dial(t, addr))
	return func(md ...string) error {
		ctx := metadata.AppendToOutgoingContext(context.Background(), md...)
		_, err := client.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "traced", Descriptors: []*rlcommon.RateLimitDescriptor{desc("k", "v")}})
		return err
	}
}

// startTraced runs the service with the incumbent's tracing environment
// (plus vars) exporting to recv, over tracedRules and a Redis of its own.
func startTraced(t *testing.T, recv *otlpReceiver, vars map[string]string) *instance {
	t.Helper()
	e := map[string]string{
		"RATELIMITD_ENV_COMPAT":       "envoyproxy",
		"USE_STATSD":                  "false",
		"TRACING_ENABLED":             "true",
		"TRACING_EXPORTER_PROTOCOL":   "grpc", // the incumbent's default is http
		"OTEL_EXPORTER_OTLP_ENDPOINT": "http://" + recv.addr,
	}
	maps.Copy(e, vars)
	return start(t, env(e), "--config", writeRules(t, tracedRules), "--redis-url", redistest.Start(t).URL())
}

// TestTracing: with the incumbent's tracing environment (TRACING_ENABLED,
// OTEL_EXPORTER_OTLP_ENDPOINT) an in-process OTLP collector receives a
// ShouldRateLimit span whose parent is the span the caller sent in its
// gRPC metadata (W3C traceparent; then B3), with the decision's
// attributes and the Redis round trip as its child; /json calls are
// traced from their HTTP headers; a malformed traceparent is ignored.
func TestTracing(t *testing.T) {
	recv := startOTLP(t, "grpc")
	in := startTraced(t, recv, map[string]string{"TRACING_SERVICE_NAME": "rl-test"})
	ask := tracedAsk(t, in.grpcAddr)

	const traceID, parentID = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
	if err := ask("traceparent", "00-"+traceID+"-"+parentID+"-01"); err != nil {
		t.Fatal(err)
	}
	srv := recv.find(t, traceID, "envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit")
	if got := hex.EncodeToString(srv.span.GetParentSpanId()); got != parentID {
		t.Errorf("server span's parent %s, want the caller's %s", got, parentID)
	}
	if srv.service != "rl-test" || srv.span.GetKind() != tracepb.Span_SPAN_KIND_SERVER {
		t.Errorf("service %q kind %v", srv.service, srv.span.GetKind())
	}
	for k, want := range map[string]string{"ratelimit.domain": "traced", "ratelimit.descriptors": "1",
		"ratelimit.overall_code": "OK", "ratelimit.answer_path": "store"} {
		if got := attr(srv.span, k); got != want {
			t.Errorf("%s = %q, want %q", k, got, want)
		}
	}
	rs := recv.find(t, traceID, "redis")
	if !bytes.Equal(rs.span.GetParentSpanId(), srv.span.GetSpanId()) || attr(rs.span, "ratelimit.redis.batch_size") != "1" ||
		attr(rs.span, "ratelimit.redis.script") != "decide.lua" {
		t.Errorf("redis span: parent %x (want %x), attributes %v", rs.span.GetParentSpanId(), srv.span.GetSpanId(), rs.span.GetAttributes())
	}

	// B3, as Envoy's Zipkin tracer sends it.
	const b3Trace = "80f198ee56343ba864fe8b2a57d3eff7"
	if err := ask("b3", b3Trace+"-e457b5a2e4d86bd1-1"); err != nil {
		t.Fatal(err)
	}
	recv.find(t, b3Trace, "envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit")

	// A malformed traceparent is no error: the call starts a new trace.
	if err := ask("traceparent", "00-zz-not-a-trace-01"); err != nil {
		t.Errorf("malformed traceparent: %v", err)
	}

	// /json takes the trace context from its HTTP headers.
	const jsonTrace = "0af7651916cd43dd8448eb211c80319c"
	req, _ := http.NewRequest(http.MethodPost, "http://"+in.httpAddr+"/json",
		strings.NewReader(`{"domain":"traced","descriptors":[{"entries":[{"key":"k","value":"v"}]}]}`))
	req.Header.Set("traceparent", "00-"+jsonTrace+"-b7ad6b7169203331-01")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	recv.find(t, jsonTrace, "POST /json")
}

// TestTracingHTTP: the same spans over OTLP/HTTP (--tracing-protocol
// http), and a collector that cannot be reached costs decisions nothing:
// each is answered at once, the lost spans counted.
func TestTracingHTTP(t *testing.T) {
	recv := startOTLP(t, "http")
	in := start(t, env(nil), "--config", writeRules(t, tracedRules), "--tracing-endpoint", recv.addr, "--tracing-protocol", "http")
	const traceID = "5bf92f3577b34da6a3ce929d0e0e4736"
	if err := tracedAsk(t, in.grpcAddr)("traceparent", "00-"+traceID+"-00f067aa0ba902b7-01"); err != nil {
		t.Fatal(err)
	}
	recv.find(t, traceID, "envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit")

	dead := freeAddr(t) // nothing listens there
	in = start(t, env(nil), "--config", writeRules(t, tracedRules), "--tracing-endpoint", dead)
	ask := tracedAsk(t, in.grpcAddr)
	var slowest time.Duration
	for i := range 300 {
		start := time.Now()
		if err := ask("traceparent", fmt.Sprintf("00-%032x-00f067aa0ba902b7-01", i+1)); err != nil {
			t.Fatal(err)
		}
		slowest = max(slowest, time.Since(start))
	}
	if slowest > time.Second {
		t.Errorf("a decision took %v with the collector unreachable", slowest)
	}
	eventuallyWithin(t, 20*time.Second, "spans counted as lost", func() error {
		if v := scrape(t, in.httpAddr, `ratelimitd_trace_spans_dropped_total{reason="export_failed"}`); v == "" || v == "0" {
			return fmt.Errorf("export_failed %q", v)
		}
		return nil
	})
}
