package main

import (
	"context"
	"fmt"
	"net"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/encoding/protowire"
)

// rawCodec sends a message's bytes as they are: what no protobuf library
// writes (a field given twice) reaches the service.
type rawCodec struct{}

func (rawCodec) Marshal(v any) ([]byte, error) { return *v.(*[]byte), nil }
func (rawCodec) Unmarshal(b []byte, v any) error {
	*v.(*[]byte) = append([]byte(nil), b...)
	return nil
}
func (rawCodec) Name() string { return "proto" }

// TestKeptNamesHoldNoRequest: 100 requests of ~1 MB with unknown domains,
// each a 1 MB domain shadowed by a short one (protobuf's last one wins),
// beside descriptors of short entries and one of 4,000 bytes,
// grow the process by at most 30 MB where the decoded names are kept: the
// incumbent's stats (they keep unknown domain names; statsd on, as under
// the incumbent's environment) and spans queued for a collector that is
// down. A kept string must not keep its request (it kept 106 MB).
func TestKeptNamesHoldNoRequest(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector's shadow memory grows with every buffer touched: ./scripts/test.sh runs this without it")
	}
	dead := func() string {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := l.Addr().String()
		l.Close()
		return addr
	}
	for name, vars := range map[string]map[string]string{
		"incumbent's stats": {"USE_STATSD": "true", "STATSD_HOST": "127.0.0.1", "STATSD_PORT": "9"},
		"tracing to a dead collector": {"TRACING_ENABLED": "true", "TRACING_SAMPLING_RATE": "1",
			"TRACING_EXPORTER_PROTOCOL": "grpc", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://" + dead()},
	} {
		t.Run(name, func(t *testing.T) {
			vars["RUNTIME_ROOT"] = incumbentRules(t, "domain: known\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 10}\n")
			vars["RUNTIME_SUBDIRECTORY"] = "ratelimit"
			p := runAsIncumbent(t, vars)
			cc, err := grpc.NewClient(p.grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				t.Fatal(err)
			}
			defer cc.Close()
			send := func(i int) {
				b := protowire.AppendString(protowire.AppendTag(nil, 1, protowire.BytesType), strings.Repeat("x", 1_000_000))
				b = protowire.AppendString(protowire.AppendTag(b, 1, protowire.BytesType), fmt.Sprint("unknown-", i))
				e := protowire.AppendString(protowire.AppendTag(nil, 1, protowire.BytesType), "k")
				e = protowire.AppendString(protowire.AppendTag(e, 2, protowire.BytesType), "v")
				b = protowire.AppendBytes(protowire.AppendTag(b, 2, protowire.BytesType), protowire.AppendBytes(protowire.AppendTag(nil, 1, protowire.BytesType), e))
				e = protowire.AppendString(protowire.AppendTag(nil, 1, protowire.BytesType), "large")
				e = protowire.AppendString(protowire.AppendTag(e, 2, protowire.BytesType), strings.Repeat("y", 4000))
				b = protowire.AppendBytes(protowire.AppendTag(b, 2, protowire.BytesType), protowire.AppendBytes(protowire.AppendTag(nil, 1, protowire.BytesType), e))
				var out []byte
				if err := cc.Invoke(context.Background(), "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit", &b, &out, grpc.ForceCodec(rawCodec{})); err != nil {
					t.Fatalf("request %d: %v", i, err)
				}
			}
			send(-1) // the buffers a first request makes
			before := procRSS(t, p.pid)
			for i := range 100 {
				send(i)
			}
			after := procRSS(t, p.pid)
			t.Logf("resident %d -> %d kB", before, after)
			if grown := (after - before) / 1024; grown > 30 {
				t.Fatalf("the process grew by %d MB over 100 requests of 1 MB with unknown domains, want at most 30", grown)
			}
		})
	}
}
