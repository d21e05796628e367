package main

import (
	"context"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/ratelimitd/ratelimitd/internal/redisstore/redistest"
)

// incumbentRules writes rules where the incumbent's environment finds
// them (RUNTIME_ROOT/ratelimit/config) and returns RUNTIME_ROOT.
func incumbentRules(t *testing.T, body string) string {
	t.Helper()
	root := t.TempDir()
	cfg := filepath.Join(root, "ratelimit", "config")
	if err := os.MkdirAll(cfg, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(cfg, "rules.yaml"), []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return root
}

// TestIncumbentStatsdByDefault: run as ratelimit with the incumbent's
// environment and no USE_STATSD, the stats go to STATSD_HOST:STATSD_PORT
// over TCP, as the incumbent sends them unless USE_STATSD=false.
func TestIncumbentStatsdByDefault(t *testing.T) {
	sd := startStatsd(t, "tcp")
	host, port, _ := net.SplitHostPort(sd.addr)
	srv := redistest.Start(t)
	grpcAddr := runAsIncumbent(t, map[string]string{
		"USE_STATSD": "", "STATSD_HOST": host, "STATSD_PORT": port, "STATS_FLUSH_INTERVAL": "100ms",
		"RUNTIME_ROOT": incumbentRules(t, tracedRules), "RUNTIME_SUBDIRECTORY": "ratelimit",
		"REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": srv.Addr(),
	}).grpcAddr
	client := rlsv3.NewRateLimitServiceClient(dial(t, grpcAddr))
	if _, err := client.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "traced",
		Descriptors: []*rlcommon.RateLimitDescriptor{desc("k", "v")}}); err != nil {
		t.Fatal(err)
	}
	eventuallyWithin(t, 20*time.Second, "the incumbent's stats at the statsd server", func() error {
		if !sd.has("ratelimit.service.rate_limit.traced.k.total_hits") {
			return fmt.Errorf("got:\n%s", sd.lines())
		}
		return nil
	})
}

// TestIncumbentRedisUser: REDIS_AUTH=user:password authenticates as that
// ACL user with that password (not the whole value as a password): the
// limit is enforced, which only a Redis that answers can do.
func TestIncumbentRedisUser(t *testing.T) {
	srv := redistest.Start(t)
	admin := srv.Client()
	ctx := context.Background()
	if err := admin.Do(ctx, "ACL", "SETUSER", "limiter", "on", ">s3cret", "~*", "&*", "+@all").Err(); err != nil {
		t.Fatal(err)
	}
	if err := admin.Do(ctx, "ACL", "SETUSER", "default", "off").Err(); err != nil {
		t.Fatal(err)
	}
	grpcAddr := runAsIncumbent(t, map[string]string{
		"REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": srv.Addr(), "REDIS_AUTH": "limiter:s3cret",
		"RUNTIME_ROOT":         incumbentRules(t, "domain: acl\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 1}\n"),
		"RUNTIME_SUBDIRECTORY": "ratelimit",
	}).grpcAddr
	redistest.AwayFromHourEnd(5 * time.Second)
	client := rlsv3.NewRateLimitServiceClient(dial(t, grpcAddr))
	var codes []rlsv3.RateLimitResponse_Code
	eventuallyWithin(t, 20*time.Second, "the limit decided in Redis as the ACL user", func() error {
		r, err := client.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "acl", Descriptors: []*rlcommon.RateLimitDescriptor{desc("k", "v")}})
		if err != nil {
			return err
		}
		codes = append(codes, r.GetOverallCode())
		if r.GetOverallCode() != rlsv3.RateLimitResponse_OVER_LIMIT {
			return fmt.Errorf("answers so far %v: a second call over a limit of 1 is still OK (Redis not reached?)", codes)
		}
		return nil
	})
}

// TestTracingDefaults: TRACING_ENABLED without an endpoint exports to
// OTLP's own port of the protocol on this host, as the SDK's defaults:
// 4317 for gRPC, 4318 for HTTP; and without TRACING_EXPORTER_PROTOCOL
// over HTTP, the incumbent's default (its settings.go:
// `TRACING_EXPORTER_PROTOCOL` default "http").
func TestTracingDefaults(t *testing.T) {
	for proto, want := range map[string]string{"": "localhost:4318", "grpc": "localhost:4317", "http": "localhost:4318"} {
		s, err := parseSettings(nil, envFor("/bin/ratelimit", env(map[string]string{
			"TRACING_ENABLED": "true", "TRACING_EXPORTER_PROTOCOL": proto, "RUNTIME_ROOT": "/r", "RUNTIME_SUBDIRECTORY": "x",
			"USE_STATSD": "false",
		})), io.Discard)
		if err != nil {
			t.Fatalf("protocol %q: %v", proto, err)
		}
		if s.tracing.Endpoint != want {
			t.Errorf("protocol %q: endpoint %q, want %q", proto, s.tracing.Endpoint, want)
		}
		if wantProto := map[bool]string{true: "grpc", false: "http"}[want == "localhost:4317"]; !strings.EqualFold(s.tracing.Protocol, wantProto) {
			t.Errorf("protocol %q: exporter protocol %q, want %q", proto, s.tracing.Protocol, wantProto)
		}
	}
}

// TestTracingSamplingRate: TRACING_SAMPLING_RATE=0 keeps no trace that
// starts here, while a caller's sampled trace is still followed.
func TestTracingSamplingRate(t *testing.T) {
	recv := startOTLP(t, "grpc")
	in := startTraced(t, recv, map[string]string{"TRACING_SAMPLING_RATE": "0"})
	send := tracedAsk(t, in.grpcAddr)
	ask := func(md ...string) {
		if err := send(md...); err != nil {
			t.Fatal(err)
		}
	}
	for range 20 {
		ask() // no parent: a trace that starts here, sampled at 0
	}
	const traceID = "4bf92f3577b34da6a3ce929d0e0e4737"
	ask("traceparent", "00-"+traceID+"-00f067aa0ba902b7-01")
	// The caller's trace arrives; the batch that carries it carries any
	// span ended before it, so nothing else came.
	recv.find(t, traceID, "envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit")
	recv.mu.Lock()
	defer recv.mu.Unlock()
	for _, s := range recv.spans {
		if id := hex.EncodeToString(s.span.GetTraceId()); id != traceID {
			t.Errorf("span %q of trace %s exported with TRACING_SAMPLING_RATE=0", s.span.GetName(), id)
		}
	}
}

// TestTracingHTTPByDefault: with TRACING_ENABLED and no
// TRACING_EXPORTER_PROTOCOL, the spans reach an OTLP/HTTP collector, as
// the incumbent sends them.
func TestTracingHTTPByDefault(t *testing.T) {
	recv := startOTLP(t, "http")
	in := startTraced(t, recv, map[string]string{"TRACING_EXPORTER_PROTOCOL": ""})
	const traceID = "6bf92f3577b34da6a3ce929d0e0e4736"
	if err := tracedAsk(t, in.grpcAddr)("traceparent", "00-"+traceID+"-00f067aa0ba902b7-01"); err != nil {
		t.Fatal(err)
	}
	recv.find(t, traceID, "envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit")
}
