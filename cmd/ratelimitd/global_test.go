package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/ratelimitd/ratelimitd/internal/redisstore/redistest"
)

// TestGlobalRuleAcrossRegions: two instances, each with its own Redis
// (two regions) and the same home (--global-redis-url): a rule marked
// global admits its limit once over both, where an ordinary rule admits
// it in each region.
func TestGlobalRuleAcrossRegions(t *testing.T) {
	redistest.AwayFromWindowEnd(time.Minute, 10*time.Second)
	home := redistest.Start(t)
	rules := filepath.Join(t.TempDir(), "rules.yaml")
	os.WriteFile(rules, []byte(`domain: api
descriptors:
  - key: tenant
    value: shared
    rate_limit: {unit: minute, requests_per_unit: 20, global: true}
  - key: tenant
    value: apart
    rate_limit: {unit: minute, requests_per_unit: 20}
`), 0o600)
	var clients []rlsv3.RateLimitServiceClient
	for range 2 {
		in := start(t, env(nil), "--config", rules, "--redis-url", redistest.Start(t).URL(), "--global-redis-url", home.URL(),
			"--global-refresh", "50ms")
		clients = append(clients, rlsv3.NewRateLimitServiceClient(dial(t, in.grpcAddr)))
		if !strings.Contains(in.log.String(), "global limits drawn from the home Redis") {
			t.Errorf("the startup log does not say where global limits are drawn from:\n%s", in.log.String())
		}
	}
	admitted := func(tenant string) int {
		n := 0
		// Demand for a few refreshes, so that grants flow.
		for i := range 200 {
			resp, err := clients[i%2].ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*rlcommon.RateLimitDescriptor{desc("tenant", tenant)}})
			if err != nil {
				t.Fatal(err)
			}
			if resp.GetOverallCode() == rlsv3.RateLimitResponse_OK {
				n++
			}
			time.Sleep(2 * time.Millisecond)
		}
		return n
	}
	if n := admitted("shared"); n > 20 || n == 0 {
		t.Errorf("the global rule admitted %d over two regions; want at most its limit 20, and some", n)
	}
	if n := admitted("apart"); n != 40 {
		t.Errorf("the ordinary rule admitted %d over two regions; want 20 in each", n)
	}
}
