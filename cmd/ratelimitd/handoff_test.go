package main

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/ratelimitd/ratelimitd/internal/redisstore/redistest"
)

// TestRollingUpdateKeepsCharges: an instance takes usage charges while
// Redis is out of its reach (answered by the failure policy, kept by its
// charge journal, on by default) and is stopped as a rolling update
// stops it; Redis comes back during its shutdown, and the instance hands
// the charges over before it exits: the other instance's next check
// sees every charge.
func TestRollingUpdateKeepsCharges(t *testing.T) {
	srv := redistest.Start(t)
	redistest.AwayFromHourEnd(30 * time.Second)
	link := redistest.NewLink(t, srv.Addr())
	rules := writeRules(t, budgetYAML)
	a := start(t, env(nil), "--config", rules, "--redis-url", fmt.Sprintf("redis://127.0.0.1:%d", link.Port), "--redis-timeout", "2s")
	b := start(t, env(nil), "--config", rules, "--redis-url", srv.URL(), "--redis-timeout", "2s")
	clientA := rlsv3.NewRateLimitServiceClient(dial(t, a.grpcAddr))
	clientB := rlsv3.NewRateLimitServiceClient(dial(t, b.grpcAddr))
	ask := func(c rlsv3.RateLimitServiceClient, hits uint64) *rlsv3.RateLimitResponse {
		t.Helper()
		d := desc("user", "rolling")
		d.HitsAddend = wrapperspb.UInt64(hits)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		r, err := c.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "llm", Descriptors: []*rlcommon.RateLimitDescriptor{d}})
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	ask(clientA, 0)
	if r := ask(clientA, 100); r.GetStatuses()[0].GetLimitRemaining() != 900 {
		t.Fatalf("the first charge: %v, want 900 left", r)
	}
	link.Cut()
	for range 3 {
		if r := ask(clientA, 50); r.GetOverallCode() != rlsv3.RateLimitResponse_OK {
			t.Fatalf("a charge with Redis out of reach: %v, want OK by the failure policy", r)
		}
	}
	stopped := make(chan error, 1)
	go func() { stopped <- a.stop() }()
	time.Sleep(300 * time.Millisecond)
	link.Restore(t)
	if err := <-stopped; err != nil {
		t.Fatal(err)
	}
	if r := ask(clientB, 0); r.GetStatuses()[0].GetLimitRemaining() != 750 {
		t.Fatalf("the other instance after the update: %v, want 750 left (100 and three charges of 50)\n%s", r, a.log.String())
	}
	if !strings.Contains(a.log.String(), "charge journal on") {
		t.Errorf("the startup log does not say charges are protected:\n%s", a.log.String())
	}
}
