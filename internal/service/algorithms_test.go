package service_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/ratelimitd/ratelimitd/config"
	"github.com/ratelimitd/ratelimitd/internal/lease"
	"github.com/ratelimitd/ratelimitd/internal/memstore"
	"github.com/ratelimitd/ratelimitd/internal/redisstore"
	"github.com/ratelimitd/ratelimitd/internal/redisstore/redistest"
	"github.com/ratelimitd/ratelimitd/internal/service"
)

const algoRules = `
domain: web
descriptors:
  - key: bucket
    rate_limit: {unit: hour, requests_per_unit: 3600, algorithm: token_bucket, burst: 10}
  - key: sliding
    rate_limit: {unit: hour, requests_per_unit: 10, algorithm: sliding_window}
  - key: fixed
    rate_limit: {unit: minute, requests_per_unit: 10, unit_multiplier: 60}
`

func parseRules(t testing.TB, body string) *config.Snapshot {
	t.Helper()
	snap, err := config.Parse("rules.yaml", []byte(body))
	if err != nil {
		t.Fatal(err)
	}
	return snap
}

// TestAlgorithmsConcurrent fires 200 concurrent requests at each
// algorithm: exactly 10 pass (a token bucket of burst 10 refilling one a
// second; a sliding and a fixed window of 10), and every key has a TTL.
func TestAlgorithmsConcurrent(t *testing.T) {
	srv := redistest.Start(t)
	st, err := redisstore.New(redisstore.Options{URL: srv.URL(), Timeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	s := service.New(parseRules(t, algoRules), st, nil, service.Options{})
	now, _ := srv.Client().Time(context.Background()).Result()
	if left := now.Truncate(time.Hour).Add(time.Hour).Sub(now); left < 10*time.Second {
		time.Sleep(left + time.Second)
	}
	for _, key := range []string{"bucket", "sliding", "fixed"} {
		var ok atomic.Int64
		var wg sync.WaitGroup
		gun := make(chan struct{})
		for range 200 {
			wg.Go(func() {
				<-gun
				r, err := s.ShouldRateLimit(context.Background(), request(desc(key, "x")))
				if err != nil {
					t.Error(err)
					return
				}
				if r.GetOverallCode() == rlsv3.RateLimitResponse_OK {
					ok.Add(1)
				}
			})
		}
		close(gun)
		wg.Wait()
		// A token refills every second: allow one if the burst took that long.
		if got := ok.Load(); got != 10 && !(key == "bucket" && got == 11) {
			t.Errorf("%s: %d of 200 admitted, want 10", key, got)
		}
	}
	ctx := context.Background()
	keys, err := srv.Client().Keys(ctx, "*").Result()
	if err != nil || len(keys) != 3 {
		t.Fatalf("keys = %v, %v", keys, err)
	}
	for _, k := range keys {
		if ttl := srv.Client().PTTL(ctx, k).Val(); ttl <= 0 {
			t.Errorf("%s has TTL %v", k, ttl)
		}
	}
	r := call(t, s, request(desc("fixed", "x")))
	if cl := r.GetStatuses()[0].GetCurrentLimit(); cl.GetUnitMultiplier().GetValue() != 60 || cl.GetUnit() != rlsv3.RateLimitResponse_RateLimit_MINUTE {
		t.Errorf("current_limit = %v, want unit_multiplier 60 minutes", cl)
	}
	if d := r.GetStatuses()[0].GetDurationUntilReset().AsDuration(); d > time.Hour {
		t.Errorf("reset %v beyond the 60-minute window", d)
	}
}

// TestAlgorithmChangeStartsAfresh: a counter of one algorithm or unit is
// never read as another's.
func TestAlgorithmChangeStartsAfresh(t *testing.T) {
	forEachStore(t, func(t *testing.T, st service.Store) {
		rule := func(extra string) *config.Snapshot {
			return parseRules(t, "domain: web\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 2"+extra+"}\n")
		}
		s := service.New(rule(""), st, nil, service.Options{})
		for range 2 {
			call(t, s, request(desc("k", "v")))
		}
		if r := call(t, s, request(desc("k", "v"))); codes(r) != "OVER_LIMIT OVER_LIMIT" {
			t.Fatalf("exhausted: %v", codes(r))
		}
		for _, extra := range []string{", algorithm: sliding_window", ", algorithm: token_bucket", ", unit_multiplier: 2"} {
			s.SetRules(rule(extra))
			if r := call(t, s, request(desc("k", "v"))); codes(r) != "OK OK" || r.GetStatuses()[0].GetLimitRemaining() != 1 {
				t.Errorf("after changing to%s: %v, want a fresh counter", extra, r)
			}
		}
		s.SetRules(rule(""))
		if r := call(t, s, request(desc("k", "v"))); codes(r) != "OVER_LIMIT OVER_LIMIT" {
			t.Errorf("back to the fixed window: %v, want the old counter", codes(r))
		}
	})
}

// TestLeasedRule: a rule with lease: true reaches the store as leased
// checks. The embedded store decides it exactly; redisstore from grants,
// in process for most requests; both admit exactly the limit.
func TestLeasedRule(t *testing.T) {
	redistest.AwayFromHourEnd(10 * time.Second)
	rules := parseRules(t, "domain: web\ndescriptors:\n  - key: hot\n    rate_limit: {unit: hour, requests_per_unit: 50, lease: true}\n")
	srv := redistest.Start(t)
	reg := prometheus.NewRegistry()
	lm := lease.NewMetrics(reg)
	red, err := redisstore.New(redisstore.Options{URL: srv.URL(), Timeout: 2 * time.Second, Metrics: redisstore.NewMetrics(reg)})
	if err != nil {
		t.Fatal(err)
	}
	defer red.Close()
	rs := lease.New(red, lease.Options{Interval: 10 * time.Millisecond, Timeout: 2 * time.Second, Metrics: lm})
	defer rs.Close()
	for name, st := range map[string]service.Store{"memstore": memstore.New(memstore.Options{}), "redisstore": rs} {
		s := service.New(rules, st, nil, service.Options{})
		var ok atomic.Int64
		var wg sync.WaitGroup
		for range 4 {
			wg.Go(func() {
				for range 40 {
					r, err := s.ShouldRateLimit(context.Background(), request(desc("hot", "x")))
					if err == nil && r.GetOverallCode() == rlsv3.RateLimitResponse_OK {
						ok.Add(1)
					}
					time.Sleep(2 * time.Millisecond)
				}
			})
		}
		wg.Wait()
		if ok.Load() != 50 {
			t.Errorf("%s: %d of 160 admitted, want exactly 50", name, ok.Load())
		}
	}
	if local := testutil.ToFloat64(lm.LeaseDecisions.WithLabelValues("local")); local < 10 {
		t.Errorf("%v requests decided in process by redisstore; want grants in use", local)
	}
}
