package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	rlsconf "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/ratelimitd/ratelimitd/internal/redisstore/redistest"
	"github.com/ratelimitd/ratelimitd/internal/xds/xdstest"
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
		in := start(t, env(nil), "--config", rules, "--redis-url", redistest.Start(t).URL(), "--redis-timeout", "2s", "--global-redis-url", home.URL(),
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

// TestGlobalDomainsAIGatewayBudget: Envoy AI Gateway's quota rules, served
// over xDS with no way to say global, made so by --global-domains: two
// regions' instances spend one token budget of 1,000 an hour. A stream's
// request-phase call (no hits: it costs 1) and its end's charge (the
// tokens) on either; once the charges of both regions pass the budget,
// both refuse, and the home has counted every token charged. The same
// rules without the flag keep a budget per region.
func TestGlobalDomainsAIGatewayBudget(t *testing.T) {
	redistest.AwayFromHourEnd(30 * time.Second)
	home := redistest.Start(t)
	mgmt := xdstest.Start(t, "127.0.0.1:0")
	mgmt.Set("default", "1", &rlsconf.RateLimitConfig{Name: "ai-gateway-quota", Domain: "ai-gateway-quota",
		Descriptors: []*rlsconf.RateLimitDescriptor{{Key: "backend_name", Value: "b", Descriptors: []*rlsconf.RateLimitDescriptor{
			quotaBucket("per-hour", rlsconf.RateLimitUnit_HOUR, 1000, false)}}}})
	regions := func(args ...string) []rlsv3.RateLimitServiceClient {
		var clients []rlsv3.RateLimitServiceClient
		for range 2 {
			in := start(t, env(nil), append([]string{"--xds-server", mgmt.Addr, "--redis-url", redistest.Start(t).URL(), "--redis-timeout", "2s",
				"--global-redis-url", home.URL(), "--global-refresh", "50ms"}, args...)...)
			clients = append(clients, rlsv3.NewRateLimitServiceClient(dial(t, in.grpcAddr)))
		}
		return clients
	}
	call := func(c rlsv3.RateLimitServiceClient, tokens uint64) rlsv3.RateLimitResponse_Code {
		t.Helper()
		d := &rlcommon.RateLimitDescriptor{Entries: []*rlcommon.RateLimitDescriptor_Entry{{Key: "backend_name", Value: "b"}, {Key: "bucket", Value: "per-hour"}}}
		if tokens > 0 {
			d.HitsAddend = wrapperspb.UInt64(tokens)
		}
		r, err := c.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "ai-gateway-quota", Descriptors: []*rlcommon.RateLimitDescriptor{d}})
		if err != nil {
			t.Fatal(err)
		}
		return r.GetOverallCode()
	}
	const ok, over = rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT
	// Two streams in each region, each a check and an end charging 300:
	// 1,204 over both, 602 in each.
	spend := func(clients []rlsv3.RateLimitServiceClient) {
		for i := range 4 {
			c := clients[i%2]
			eventuallyWithin(t, 10*time.Second, "a stream's check admitted", func() error {
				if code := call(c, 0); code != ok {
					return fmt.Errorf("stream %d's check: %v", i, code)
				}
				return nil
			})
			call(c, 300)
		}
	}
	clients := regions("--global-domains", "ai-gateway-*")
	spend(clients)
	eventuallyWithin(t, 5*time.Second, "both regions refusing the spent global budget", func() error {
		for i, c := range clients {
			if code := call(c, 0); code != over {
				return fmt.Errorf("region %d's check: %v", i, code)
			}
		}
		return nil
	})
	// What the instances owe reaches the home in the background (a
	// settle a refresh later): the count gets there, not at once.
	eventuallyWithin(t, 10*time.Second, "the home counting every charge and check", func() error {
		keys, err := home.Client().Keys(context.Background(), "*").Result()
		if err != nil || len(keys) == 0 {
			return fmt.Errorf("the home's keys: %v, %v", keys, err)
		}
		counters := 0
		for _, k := range keys {
			if strings.HasSuffix(k, "|settled") {
				continue
			}
			counters++
			raw, _ := home.Client().Get(context.Background(), k).Result()
			_, count, _ := strings.Cut(raw, ":")
			if n, _ := strconv.Atoi(count); n < 1204 {
				return fmt.Errorf("the home counts %s = %q; want at least the 1,200 tokens charged and 4 checks", k, raw)
			}
		}
		if counters != 1 {
			return fmt.Errorf("the home holds %d counters (%v); want the budget's", counters, keys)
		}
		return nil
	})
	// Without the flag, each region keeps its own budget: 602 spent in
	// each, both still admit.
	apart := regions()
	spend(apart)
	for i, c := range apart {
		if code := call(c, 0); code != ok {
			t.Errorf("without --global-domains, region %d refused with 602 of its 1,000 spent: %v", i, code)
		}
	}
}

// TestGlobalSaidWhereUsersLook: a global rule without a home is said so
// by check-config and by the server at load (each region then enforces
// its own); a home that does not answer at start is said to leave global
// checks to the partition policy, not the failure mode; the startup line
// names the global domains.
func TestGlobalSaidWhereUsersLook(t *testing.T) {
	rules := writeRules(t, "domain: api\ndescriptors:\n  - key: tenant\n    rate_limit: {unit: minute, requests_per_unit: 100, global: true}\n")
	var out, errOut syncBuffer
	if err := run(context.Background(), []string{"check-config", rules}, env(nil), &out, &errOut); err != nil {
		t.Fatalf("check-config: %v\n%s", err, errOut.String())
	}
	if !strings.Contains(errOut.String(), "note: 1 limit(s) global") || !strings.Contains(errOut.String(), "--global-redis-url") {
		t.Errorf("check-config said nothing of the global limit:\n%s", errOut.String())
	}
	in := start(t, env(nil), "--config", rules)
	if log := in.log.String(); !strings.Contains(log, "rules mark limits global") || !strings.Contains(log, "each region enforces them on its own") {
		t.Errorf("the server loaded a global rule without a home silently:\n%s", log)
	}
	region := redistest.Start(t)
	in = start(t, env(nil), "--config", rules, "--redis-url", region.URL(), "--global-redis-url", "redis://"+freeAddr(t),
		"--global-domains", "api")
	log := in.log.String()
	if !strings.Contains(log, "the home Redis does not answer yet; global checks beyond what is held follow --global-partition") ||
		strings.Contains(log, "rules mark limits global") {
		t.Errorf("a home not answering at start:\n%s", log)
	}
	if !strings.Contains(log, "global_domains=api") {
		t.Errorf("the startup line does not name the global domains:\n%s", log)
	}
}
