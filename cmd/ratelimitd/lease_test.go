package main

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/ratelimitd/ratelimitd/internal/redisstore/redistest"
)

const leaseRules = `domain: lease
descriptors:
  - key: k
    rate_limit: {unit: second, unit_multiplier: 10, requests_per_unit: 1000, lease: true}
`

// TestLeaseHolderKilled: an instance holding a grant is killed (SIGKILL):
// it never gives the grant back, yet the other instance still admits all
// of the window's limit but what the dead one held, the two together
// never more than the limit; and the next window is whole. Redis calls
// wait up to 2 s: a busy machine's call past the default 50 ms would be
// answered by the failure policy (allow), over the limit.
func TestLeaseHolderKilled(t *testing.T) {
	srv := redistest.Start(t)
	dir := t.TempDir()
	rules := filepath.Join(dir, "rules.yaml")
	if err := os.WriteFile(rules, []byte(leaseRules), 0o600); err != nil {
		t.Fatal(err)
	}
	// Ten-second windows from the epoch: start early in one, so that the
	// first part of the test ends inside it.
	if into := time.Now().UnixMilli() % 10_000; into > 2_000 {
		time.Sleep(time.Duration(10_000-into) * time.Millisecond)
	}
	window := time.Now().UnixMilli() / 10_000

	grpcA, httpA := freeAddr(t), freeAddr(t)
	a := mainCommand(t, "--config", rules, "--redis-url", srv.URL(), "--redis-timeout", "2s", "--grpc-addr", grpcA, "--http-addr", httpA, "--lease-interval", "50ms")
	var outA syncBuffer
	a.Stdout, a.Stderr = &outA, &outA
	if err := a.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Process.Kill(); a.Wait() })
	b := start(t, env(nil), "--config", rules, "--redis-url", srv.URL(), "--redis-timeout", "2s", "--lease-interval", "50ms")
	getWithin(t, "http://"+httpA+"/healthcheck", &outA)
	clientA := rlsv3.NewRateLimitServiceClient(dial(t, grpcA))
	clientB := rlsv3.NewRateLimitServiceClient(dial(t, b.grpcAddr))
	ask := func(c rlsv3.RateLimitServiceClient) bool {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		r, err := c.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "lease", Descriptors: []*rlcommon.RateLimitDescriptor{desc("k", "v")}})
		if err != nil {
			t.Error(err)
			return false
		}
		return r.GetOverallCode() == rlsv3.RateLimitResponse_OK
	}
	load := func(c rlsv3.RateLimitServiceClient, d time.Duration, n int) int64 {
		var ok atomic.Int64
		var wg sync.WaitGroup
		end := time.Now().Add(d)
		for range 4 {
			wg.Go(func() {
				for i := 0; i < n/4 && time.Now().Before(end); i++ {
					if ask(c) {
						ok.Add(1)
					}
					time.Sleep(time.Millisecond)
				}
			})
		}
		wg.Wait()
		return ok.Load()
	}
	admittedA := load(clientA, 400*time.Millisecond, 300)
	granted := scrape(t, httpA, `ratelimitd_lease_hits_total{what="granted"}`)
	if err := a.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	a.Wait()
	raw, err := srv.Client().Get(context.Background(), keyOf(t, srv)).Result()
	if err != nil {
		t.Fatal(err)
	}
	counted, _ := strconv.ParseInt(raw[strings.LastIndexByte(raw, ':')+1:], 10, 64)
	held := counted - admittedA
	admittedB := load(clientB, 4*time.Second, 1500)
	if now := time.Now().UnixMilli() / 10_000; now != window {
		t.Fatalf("the test left its window (%d → %d): too slow a machine for its timing", window, now)
	}
	t.Logf("A admitted %d (granted %s) and held %d when killed; B admitted %d", admittedA, granted, held, admittedB)
	if held <= 0 || granted == "" || granted == "0" {
		t.Fatalf("A held no grant when killed (granted %s, Redis counted %d, A admitted %d)", granted, counted, admittedA)
	}
	if total := admittedA + admittedB; total > 1000 || total < 1000-held {
		t.Errorf("the window admitted %d; want from %d (the limit less the dead instance's grant) to 1000", total, 1000-held)
	}
	// The next window is whole.
	time.Sleep(time.Duration(10_000-time.Now().UnixMilli()%10_000+50) * time.Millisecond)
	if got := load(clientB, 5*time.Second, 1500); got != 1000 {
		t.Errorf("the next window admitted %d, want 1000", got)
	}
}

// keyOf is the one counter key in srv.
func keyOf(t *testing.T, srv *redistest.Server) string {
	t.Helper()
	keys, err := srv.Client().Keys(context.Background(), "*").Result()
	if err != nil || len(keys) != 1 {
		t.Fatalf("keys %v, %v; want the one counter", keys, err)
	}
	return keys[0]
}
