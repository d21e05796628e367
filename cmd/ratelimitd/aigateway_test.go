package main

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	rlsconf "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/ratelimitd/ratelimitd/internal/redisstore/redistest"
	"github.com/ratelimitd/ratelimitd/internal/xds/xdstest"
)

// quotaBucket is a rule of Envoy AI Gateway's QuotaPolicy as its
// controller serves it: a bucket under backend_name and
// model_name_override, quota_mode set (field 7, which the
// RateLimitConfig module ratelimitd builds with lacks).
func quotaBucket(value string, unit rlsconf.RateLimitUnit, n uint32, shadow bool) *rlsconf.RateLimitDescriptor {
	d := &rlsconf.RateLimitDescriptor{Key: "bucket", Value: value, ShadowMode: shadow,
		RateLimit: &rlsconf.RateLimitPolicy{Unit: unit, RequestsPerUnit: n}}
	d.ProtoReflect().SetUnknown(protowire.AppendVarint(protowire.AppendTag(nil, 7, protowire.VarintType), 1))
	return d
}

// TestAIGatewayQuotaDeployment runs Envoy AI Gateway's quota Deployment as
// it is written (envoyproxy/ai-gateway
// tests/e2e/testdata/backend_quota_ratelimit.yaml: command
// /bin/ratelimit, its --quotaRateLimitServiceAddr argument, its
// environment), with the xDS server and Redis local: it starts (the
// argument listed as ignored) and serves the quota rules over xDS — a
// request-phase check and the stream end's charge of the quota cost, the
// 1 s, 1 m, 1 h and 1 d windows, a shadow bucket that never refuses.
func TestAIGatewayQuotaDeployment(t *testing.T) {
	srv := redistest.Start(t)
	redistest.AwayFromHourEnd(10 * time.Second)
	mgmt := xdstest.Start(t, "127.0.0.1:0")
	model := func(buckets ...*rlsconf.RateLimitDescriptor) *rlsconf.RateLimitDescriptor {
		return &rlsconf.RateLimitDescriptor{Key: "model_name_override", Value: "gpt-4o", Descriptors: buckets}
	}
	mgmt.Set("envoy-ai-gateway-ratelimit", "1", &rlsconf.RateLimitConfig{Name: "ai-gateway-quota", Domain: "ai-gateway-quota",
		Descriptors: []*rlsconf.RateLimitDescriptor{{Key: "backend_name", Value: "default/openai/route/r/rule/0/ref/0",
			Descriptors: []*rlsconf.RateLimitDescriptor{model(
				quotaBucket("per-second", rlsconf.RateLimitUnit_SECOND, 3, false),
				quotaBucket("per-minute", rlsconf.RateLimitUnit_MINUTE, 1000, false),
				quotaBucket("per-hour", rlsconf.RateLimitUnit_HOUR, 1000, false),
				quotaBucket("per-day", rlsconf.RateLimitUnit_DAY, 1000, false),
				quotaBucket("shadow", rlsconf.RateLimitUnit_HOUR, 1, true),
			)}}}})
	p := runAsIncumbent(t, map[string]string{
		"CONFIG_TYPE": "GRPC_XDS_SOTW", "CONFIG_GRPC_XDS_NODE_ID": "envoy-ai-gateway-ratelimit", "CONFIG_GRPC_XDS_SERVER_URL": mgmt.Addr,
		"REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": srv.Addr(), "RUNTIME_ROOT": "/data", "RUNTIME_SUBDIRECTORY": "ratelimit",
		"USE_STATSD": "false", "LOG_LEVEL": "debug", "REDIS_TIMEOUT": "2s", // answers by the counters, even on a busy machine
	}, "--quotaRateLimitServiceAddr=envoy-ai-gateway-ratelimit.envoy-gateway-system")
	client := rlsv3.NewRateLimitServiceClient(dial(t, p.grpcAddr))
	call := func(bucket string, cost uint64) rlsv3.RateLimitResponse_Code {
		t.Helper()
		d := &rlcommon.RateLimitDescriptor{Entries: []*rlcommon.RateLimitDescriptor_Entry{
			{Key: "backend_name", Value: "default/openai/route/r/rule/0/ref/0"}, {Key: "model_name_override", Value: "gpt-4o"}, {Key: "bucket", Value: bucket}}}
		if cost > 0 {
			d.HitsAddend = wrapperspb.UInt64(cost)
		}
		r, err := client.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "ai-gateway-quota", Descriptors: []*rlcommon.RateLimitDescriptor{d}})
		if err != nil {
			t.Fatalf("%s: %v\n%s", bucket, err, p.log.String())
		}
		return r.GetOverallCode()
	}
	const ok, over = rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT
	eventuallyWithin(t, 10*time.Second, "the quota rules served over xDS", func() error {
		if c := call("shadow", 0); c != ok {
			return fmt.Errorf("first check: %v", c)
		}
		return nil
	})
	// The request-phase call states no hits: it costs 1, as the
	// incumbent counts it.
	for _, b := range []string{"per-minute", "per-hour", "per-day"} {
		if c := call(b, 0); c != ok {
			t.Fatalf("%s: the request-phase check: %v", b, c)
		}
		if c := call(b, 998); c != ok {
			t.Fatalf("%s: a stream end charging 998 (999 of 1,000 spent): %v", b, c)
		}
		if c := call(b, 0); c != ok {
			t.Fatalf("%s: a check with 1 of 1,000 left: %v", b, c)
		}
		if c := call(b, 5); c != over {
			t.Fatalf("%s: a charge crossing the quota: %v, want OVER_LIMIT", b, c)
		}
		if c := call(b, 0); c != over {
			t.Fatalf("%s: a check on a spent quota: %v, want OVER_LIMIT", b, c)
		}
	}
	eventuallyWithin(t, 10*time.Second, "the 1 s bucket refusing its fourth request in a second", func() error {
		var got []rlsv3.RateLimitResponse_Code
		for range 4 {
			got = append(got, call("per-second", 1))
		}
		if got[3] != over {
			return fmt.Errorf("per-second answers %v", got)
		}
		return nil
	})
	for range 3 {
		if c := call("shadow", 1); c != ok {
			t.Fatalf("shadow bucket: %v, want OK (shadow_mode)", c)
		}
	}
	if log := p.log.String(); !strings.Contains(log, "argument ignored") || !strings.Contains(log, "quotaRateLimitServiceAddr") {
		t.Errorf("the argument not listed as ignored at startup:\n%s", log)
	}
}
