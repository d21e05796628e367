package service_test

import (
	"context"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/ratelimitd/ratelimitd/internal/incumbentstats"
	"github.com/ratelimitd/ratelimitd/internal/memstore"
	"github.com/ratelimitd/ratelimitd/internal/overlimitcache"
	"github.com/ratelimitd/ratelimitd/internal/record"
	"github.com/ratelimitd/ratelimitd/internal/service"
)

// TestLocalCacheStats: answers from the local over-limit cache count in
// the incumbent's over_limit and over_limit_with_local_cache, and the
// global shadow mode's answers in global_shadow_mode.
func TestLocalCacheStats(t *testing.T) {
	compat, err := incumbentstats.New(context.Background(), incumbentstats.Options{Prometheus: true})
	if err != nil {
		t.Fatal(err)
	}
	defer compat.Close()
	snap := parseRules(t, "domain: web\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 2}\n")
	s := service.New(snap, memstore.New(memstore.Options{}), overlimitcache.New(1<<20), service.Options{Recorders: []record.Recorder{incumbentstats.NewRecorder(compat)}, ShadowMode: true})
	req := &rlsv3.RateLimitRequest{Domain: "web", Descriptors: []*rlcommon.RateLimitDescriptor{{Entries: []*rlcommon.RateLimitDescriptor_Entry{{Key: "k", Value: "v"}}}}}
	for range 5 { // 2 within; the 2nd exhausts it, so 3 from the cache
		if _, err := s.ShouldRateLimit(context.Background(), req); err != nil {
			t.Fatal(err)
		}
	}
	compat.Flush()
	want := map[string]float64{
		"ratelimit_service_rate_limit_total_hits":                        5,
		"ratelimit_service_rate_limit_within_limit":                      2,
		"ratelimit_service_rate_limit_over_limit":                        3,
		"ratelimit_service_rate_limit_web_k_over_limit_with_local_cache": 3,
		"ratelimit_service_global_shadow_mode":                           3,
	}
	// The exporter takes the flushed batch on its own goroutine.
	var got map[string]float64
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		got = map[string]float64{}
		fams, err := compat.Registry().Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range fams {
			for _, m := range f.GetMetric() {
				got[f.GetName()] += m.GetCounter().GetValue()
			}
		}
		// The batch is applied one event at a time: wait for all of it.
		done := true
		for name, w := range want {
			done = done && got[name] == w
		}
		if done {
			break
		}
	}
	for name, w := range want {
		if got[name] != w {
			t.Errorf("%s = %v, want %v", name, got[name], w)
		}
	}
}
