package main

import (
	"context"
	"fmt"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/ratelimitd/ratelimitd/internal/redisstore/redistest"
)

// TestCarryIncumbentCountsOnSwap: the image swap under the incumbent's
// environment (CACHE_KEY_PREFIX included) carries its counts by default:
// a daily budget of 1,000 of which envoyproxy/ratelimit counted 900 —
// its key written as it writes it, INCRBY and EXPIRE — takes a charge
// of 100 and refuses past it. RATELIMITD_CARRY_INCUMBENT_COUNTS=false
// starts the counter afresh.
func TestCarryIncumbentCountsOnSwap(t *testing.T) {
	srv := redistest.Start(t)
	redistest.AwayFromWindowEnd(24*time.Hour, 10*time.Second)
	ctx := context.Background()
	for _, carry := range []string{"", "false"} {
		t.Run("carry="+carry, func(t *testing.T) {
			user := "alice" + carry
			key := fmt.Sprintf("pfx:llm_user_%s_%d", user, time.Now().Unix()/86400*86400)
			admin := srv.Client()
			admin.IncrBy(ctx, key, 900)
			admin.Expire(ctx, key, 86400*time.Second)
			env := map[string]string{"REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": srv.Addr(), "CACHE_KEY_PREFIX": "pfx:",
				"RUNTIME_ROOT":         incumbentRules(t, "domain: llm\ndescriptors:\n  - key: user\n    rate_limit: {unit: day, requests_per_unit: 1000}\n"),
				"RUNTIME_SUBDIRECTORY": "ratelimit"}
			if carry != "" {
				env["RATELIMITD_CARRY_INCUMBENT_COUNTS"] = carry
			}
			p := runAsIncumbent(t, env)
			client := rlsv3.NewRateLimitServiceClient(dial(t, p.grpcAddr))
			call := func(hits uint64) *rlsv3.RateLimitResponse {
				t.Helper()
				d := &rlcommon.RateLimitDescriptor{Entries: []*rlcommon.RateLimitDescriptor_Entry{{Key: "user", Value: user}}, HitsAddend: wrapperspb.UInt64(hits)}
				r, err := client.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "llm", Descriptors: []*rlcommon.RateLimitDescriptor{d}})
				if err != nil {
					t.Fatal(err)
				}
				return r
			}
			if carry == "false" {
				if r := call(0); r.GetOverallCode() != rlsv3.RateLimitResponse_OK || r.GetStatuses()[0].GetLimitRemaining() != 1000 {
					t.Fatalf("first check after the swap, not carrying: %v, want OK with 1000 left", r)
				}
				return
			}
			if r := call(0); r.GetOverallCode() != rlsv3.RateLimitResponse_OK || r.GetStatuses()[0].GetLimitRemaining() != 100 {
				t.Fatalf("first check after the swap: %v, want OK with the incumbent's 100 left", r)
			}
			if r := call(100); r.GetOverallCode() != rlsv3.RateLimitResponse_OK || r.GetStatuses()[0].GetLimitRemaining() != 0 {
				t.Fatalf("charge of the last 100: %v", r)
			}
			if r := call(0); r.GetOverallCode() != rlsv3.RateLimitResponse_OVER_LIMIT {
				t.Fatalf("a check past the budget: %v, want OVER_LIMIT", r)
			}
		})
	}
}
