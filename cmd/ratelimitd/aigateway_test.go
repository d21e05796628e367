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

// TestAIGatewayQuotaFlows runs the flows of Envoy AI Gateway's QuotaPolicy
// e2e scenario (envoyproxy/ai-gateway tests/e2e/backend_quota_ratelimit_test.go
// and testdata/backend_quota_ratelimit.yaml: a defaultBucket of 10 tokens
// an hour per backend and model, served over xDS in quota mode) through
// the binary run as the incumbent. A flow is the request phase (the
// backend and model descriptor, no hits: it costs 1) and, when admitted,
// the stream end charging the response's quota_cost as the descriptor's
// hits_addend (0 for a failed upstream). Every request phase is answered
// as the incumbent answers it, but for the documented all-or-nothing (a
// refused request phase consumes nothing).
func TestAIGatewayQuotaFlows(t *testing.T) {
	srv := redistest.Start(t)
	redistest.AwayFromHourEnd(30 * time.Second)
	const backend = "default/envoy-ai-gateway-quota-ratelimit-testupstream"
	mgmt := xdstest.Start(t, "127.0.0.1:0")
	model := func(name string, n uint32) *rlsconf.RateLimitDescriptor {
		d := &rlsconf.RateLimitDescriptor{Key: "model_name_override", Value: name,
			RateLimit: &rlsconf.RateLimitPolicy{Unit: rlsconf.RateLimitUnit_HOUR, RequestsPerUnit: n}}
		d.ProtoReflect().SetUnknown(protowire.AppendVarint(protowire.AppendTag(nil, 7, protowire.VarintType), 1)) // quota_mode
		return d
	}
	mgmt.Set("envoy-ai-gateway-ratelimit", "1", &rlsconf.RateLimitConfig{Name: "ai-gateway-quota", Domain: "ai-gateway-quota",
		Descriptors: []*rlsconf.RateLimitDescriptor{{Key: "backend_name", Value: backend, Descriptors: []*rlsconf.RateLimitDescriptor{
			model("per-model", 10), model("non-2xx", 10), model("flows", 10), model("two-policies", 50)}}}})
	p := runAsIncumbent(t, map[string]string{
		"CONFIG_TYPE": "GRPC_XDS_SOTW", "CONFIG_GRPC_XDS_NODE_ID": "envoy-ai-gateway-ratelimit", "CONFIG_GRPC_XDS_SERVER_URL": mgmt.Addr,
		"REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": srv.Addr(), "RUNTIME_ROOT": "/data", "RUNTIME_SUBDIRECTORY": "ratelimit",
		"USE_STATSD": "false", "LOG_LEVEL": "debug", "REDIS_TIMEOUT": "2s",
	}, "--quotaRateLimitServiceAddr=envoy-ai-gateway-ratelimit.envoy-gateway-system")
	client := rlsv3.NewRateLimitServiceClient(dial(t, p.grpcAddr))
	ask := func(m string, copies int, cost *wrapperspb.UInt64Value) *rlsv3.RateLimitResponse {
		t.Helper()
		req := &rlsv3.RateLimitRequest{Domain: "ai-gateway-quota"}
		for range copies {
			req.Descriptors = append(req.Descriptors, &rlcommon.RateLimitDescriptor{HitsAddend: cost, Entries: []*rlcommon.RateLimitDescriptor_Entry{
				{Key: "backend_name", Value: backend}, {Key: "model_name_override", Value: m}}})
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		r, err := client.ShouldRateLimit(ctx, req)
		if err != nil {
			t.Fatalf("%s: %v\n%s", m, err, p.log.String())
		}
		return r
	}
	// flow is one request: its request phase (copies of the descriptor:
	// one a QuotaPolicy on the backend) and, admitted, its stream end.
	flow := func(m string, copies int, cost uint64) *rlsv3.RateLimitResponse {
		t.Helper()
		r := ask(m, copies, nil)
		if r.GetOverallCode() == rlsv3.RateLimitResponse_OK {
			ask(m, 1, wrapperspb.UInt64(cost))
		}
		return r
	}
	const ok, over = rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT
	eventuallyWithin(t, 10*time.Second, "the quota rules served over xDS", func() error {
		if r := ask("per-model", 1, wrapperspb.UInt64(0)); r.GetStatuses()[0].GetCurrentLimit().GetRequestsPerUnit() != 10 {
			return fmt.Errorf("answer %v", r)
		}
		return nil
	})
	left := func(m string) uint32 {
		t.Helper()
		return ask(m, 1, wrapperspb.UInt64(0)).GetStatuses()[0].GetLimitRemaining()
	}
	// "per-model quota": 20 tokens pass the request phase and spend the
	// quota; the next request is refused.
	if c := flow("per-model", 1, 20).GetOverallCode(); c != ok {
		t.Fatalf("per-model: the first request: %v", c)
	}
	if c := flow("per-model", 1, 5).GetOverallCode(); c != over {
		t.Fatalf("per-model: a request on a spent quota: %v, want OVER_LIMIT", c)
	}
	// "non-2xx response does not charge token quota": a failed upstream's
	// stream end charges 0; the next request passes.
	if c := flow("non-2xx", 1, 0).GetOverallCode(); c != ok {
		t.Fatalf("non-2xx: the failed request: %v", c)
	}
	if c := flow("non-2xx", 1, 2).GetOverallCode(); c != ok {
		t.Fatalf("non-2xx: the request after a failed one: %v, want OK", c)
	}
	// Costs 0, 4, 0, 6 on 10: the incumbent admits all four request
	// phases (8 requests and tokens counted by the fourth's), then refuses.
	for i, cost := range []uint64{0, 4, 0, 6} {
		if r := flow("flows", 1, cost); r.GetOverallCode() != ok {
			t.Fatalf("flows: flow %d (cost %d): %v, want OK as the incumbent", i+1, cost, r)
		}
	}
	if got := left("flows"); got != 0 {
		t.Errorf("flows: %d left after 14 counted, want 0", got)
	}
	if c := flow("flows", 1, 1).GetOverallCode(); c != over {
		t.Errorf("flows: a fifth request: %v, want OVER_LIMIT", c)
	}
	// Two QuotaPolicies on the backend put the descriptor twice in the
	// request phase: each occurrence is counted and answered in turn.
	if r := flow("two-policies", 2, 12); r.GetOverallCode() != ok || r.GetStatuses()[0].GetLimitRemaining() != 49 || r.GetStatuses()[1].GetLimitRemaining() != 48 {
		t.Fatalf("two policies, first request: %v", r)
	}
	r := flow("two-policies", 2, 0)
	if r.GetOverallCode() != ok || r.GetStatuses()[0].GetCode() != ok || r.GetStatuses()[1].GetCode() != ok ||
		r.GetStatuses()[0].GetLimitRemaining() != 35 || r.GetStatuses()[1].GetLimitRemaining() != 34 {
		t.Fatalf("two policies with 36 left: %v, want OK (35, 34) as the incumbent", r)
	}
}
