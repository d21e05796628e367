package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/ratelimitd/ratelimitd/internal/redisstore/redistest"
)

// The rules of envoyproxy/ratelimit's integration suite
// (test/integration/runtime/current/ratelimit/config), one file a domain.
var incumbentSuiteRules = map[string]string{
	"basic.yaml": "domain: basic\ndescriptors:\n  - key: key1\n    rate_limit: {unit: second, requests_per_unit: 50}\n",
	"another.yaml": "domain: another\ndescriptors:\n  - key: key2\n    rate_limit: {unit: minute, requests_per_unit: 20}\n" +
		"  - key: key3\n    rate_limit: {unit: hour, requests_per_unit: 10}\n  - key: key4\n    rate_limit: {unit: day, requests_per_unit: 20}\n",
	"share.yaml": "domain: share-threshold-test\ndescriptors:\n  - key: files\n    value: files/*\n    share_threshold: true\n    rate_limit: {unit: hour, requests_per_unit: 10}\n" +
		"  - key: files_no_share\n    value: files_no_share/*\n    rate_limit: {unit: hour, requests_per_unit: 10}\n",
}

// suiteRequest is the incumbent suite's request: every descriptor given
// as key/value pairs, and hits_addend 1 at request level on every call.
func suiteRequest(domain string, descs ...[]string) *rlsv3.RateLimitRequest {
	r := &rlsv3.RateLimitRequest{Domain: domain, HitsAddend: 1}
	for _, kv := range descs {
		r.Descriptors = append(r.Descriptors, desc(kv...))
	}
	return r
}

// wantStatuses fails unless r is overall and each status's code and
// remaining count are as given, with the limit named.
func wantStatuses(t *testing.T, what string, r *rlsv3.RateLimitResponse, overall rlsv3.RateLimitResponse_Code, want ...any) {
	t.Helper()
	if r.GetOverallCode() != overall || len(r.GetStatuses()) != len(want)/3 {
		t.Fatalf("%s: %v, want %v with %d statuses", what, r, overall, len(want)/3)
	}
	for i, st := range r.GetStatuses() {
		code, limit, remaining := want[3*i].(rlsv3.RateLimitResponse_Code), want[3*i+1].(uint32), want[3*i+2].(uint32)
		if st.GetCode() != code || st.GetCurrentLimit().GetRequestsPerUnit() != limit || st.GetLimitRemaining() != remaining {
			t.Fatalf("%s: status %d %v, want %v of %d with %d left", what, i, st, code, limit, remaining)
		}
	}
}

// TestIncumbentSuitePatterns runs the call patterns of
// envoyproxy/ratelimit's own integration suite
// (test/integration/integration_test.go: testBasicBaseConfig,
// testShareThreshold) against this binary run as the incumbent, with a
// per-second Redis, the local cache off and on. Every call states
// hits_addend 1 at request level, and every answer is the incumbent's,
// apart from the documented all-or-nothing difference (the request limit
// beside an exhausted one keeps its count, as the incumbent's
// STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT does).
func TestIncumbentSuitePatterns(t *testing.T) {
	main, perSecond := redistest.Start(t), redistest.Start(t)
	// Both subtests' hour counters (key3, the shared files/*) in one
	// window: the whole test takes well under two minutes.
	redistest.AwayFromHourEnd(2 * time.Minute)
	root := t.TempDir()
	cfg := filepath.Join(root, "ratelimit", "config")
	if err := os.MkdirAll(cfg, 0o700); err != nil {
		t.Fatal(err)
	}
	for name, body := range incumbentSuiteRules {
		if err := os.WriteFile(filepath.Join(cfg, name), []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	const ok, over = rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT
	for _, cache := range []string{"0", "1048576"} {
		t.Run("cache "+cache, func(t *testing.T) {
			p := runAsIncumbent(t, map[string]string{"REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": main.Addr(),
				"REDIS_PERSECOND": "true", "REDIS_PERSECOND_SOCKET_TYPE": "tcp", "REDIS_PERSECOND_URL": perSecond.Addr(),
				"RUNTIME_ROOT": root, "RUNTIME_SUBDIRECTORY": "ratelimit", "LOCAL_CACHE_SIZE_IN_BYTES": cache,
				// Every answer here is the counter's: on a busy machine a
				// round trip may pass the 50 ms default, and a call that
				// fails is answered by failure mode instead.
				"REDIS_TIMEOUT": "2s"})
			c := rlsv3.NewRateLimitServiceClient(dial(t, p.grpcAddr))
			ask := func(r *rlsv3.RateLimitRequest) *rlsv3.RateLimitResponse {
				t.Helper()
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				resp, err := c.ShouldRateLimit(ctx, r)
				if err != nil {
					t.Fatal(err)
				}
				return resp
			}
			wantStatuses(t, "an unknown domain", ask(suiteRequest("foo", []string{"hello", "world"})), ok, ok, uint32(0), uint32(0))
			wantStatuses(t, "the per-second key", ask(suiteRequest("basic", []string{"key1", "foo"})), ok, ok, uint32(50), uint32(49))

			// key2's forty calls below fall in one minute.
			redistest.AwayFromWindowEnd(time.Minute, 20*time.Second)
			v := fmt.Sprint(rand.Int64())
			for i := range 25 {
				code, left := ok, uint32(20-(i+1))
				if i >= 20 {
					code, left = over, 0
				}
				wantStatuses(t, fmt.Sprintf("key2 call %d", i+1), ask(suiteRequest("another", []string{"key2", v})), code, code, uint32(20), left)
			}

			v = fmt.Sprint(rand.Int64())
			for i := range 15 {
				code, left1, left2 := ok, uint32(20-(i+1)), uint32(10-(i+1))
				if i >= 10 {
					// All or nothing: key2 keeps the count it had when
					// key3 ran out (the incumbent's
					// STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT answer).
					code, left1, left2 = over, 10, 0
				}
				wantStatuses(t, fmt.Sprintf("key2 and key3 call %d", i+1), ask(suiteRequest("another", []string{"key2", v}, []string{"key3", v})),
					code, ok, uint32(20), left1, code, uint32(10), left2)
			}

			for i := range 10 {
				ask(suiteRequest("share-threshold-test", []string{"files", fmt.Sprintf("files/a%d-%s.pdf", i, cache)}))
			}
			wantStatuses(t, "a shared threshold's other value", ask(suiteRequest("share-threshold-test", []string{"files", "files/b.csv"})), over, over, uint32(10), uint32(0))
			for i := range 10 {
				wantStatuses(t, fmt.Sprintf("an unshared value %d", i), ask(suiteRequest("share-threshold-test", []string{"files_no_share", fmt.Sprintf("files_no_share/%d", rand.Int64())})),
					ok, ok, uint32(10), uint32(9))
			}

			key := fmt.Sprintf("durTest-%s-%d", cache, rand.Int64())
			first := ask(suiteRequest("another", []string{"key4", key})).GetStatuses()[0].GetDurationUntilReset().GetSeconds()
			time.Sleep(2 * time.Second)
			if later := ask(suiteRequest("another", []string{"key4", key})).GetStatuses()[0].GetDurationUntilReset().GetSeconds(); later >= first {
				t.Fatalf("duration until reset %d s, then %d s two seconds later", first, later)
			}
		})
	}
}

// TestStatedOneAcrossInstances: two instances behind one Redis, a client
// stating hits_addend 1 (request- and descriptor-level, alternately, to
// either instance, all at once) on a fresh counter of 20 an hour:
// exactly 20 OK. The instances wait up to 2 s on Redis: on a busy
// machine a call past the default 50 ms is answered by the failure
// policy (allow), which a count of OKs would take for the limit's.
func TestStatedOneAcrossInstances(t *testing.T) {
	srv := redistest.Start(t)
	redistest.AwayFromHourEnd(30 * time.Second)
	rules := writeRules(t, "domain: another\ndescriptors:\n  - key: key2\n    rate_limit: {unit: hour, requests_per_unit: 20}\n")
	var clients []rlsv3.RateLimitServiceClient
	for range 2 {
		in := start(t, env(nil), "--config", rules, "--redis-url", srv.URL(), "--redis-timeout", "2s")
		clients = append(clients, rlsv3.NewRateLimitServiceClient(dial(t, in.grpcAddr)))
	}
	for round := range 3 {
		v := fmt.Sprint(rand.Int64())
		results := make(chan rlsv3.RateLimitResponse_Code, 64)
		for i := range 64 {
			go func() {
				r := &rlsv3.RateLimitRequest{Domain: "another", Descriptors: []*rlcommon.RateLimitDescriptor{desc("key2", v)}}
				if i%2 == 0 {
					r.HitsAddend = 1
				} else {
					r.Descriptors[0].HitsAddend = wrapperspb.UInt64(1)
				}
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				resp, err := clients[i%2].ShouldRateLimit(ctx, r)
				if err != nil {
					t.Error(err)
				}
				results <- resp.GetOverallCode()
			}()
		}
		admitted := 0
		for range 64 {
			if <-results == rlsv3.RateLimitResponse_OK {
				admitted++
			}
		}
		if admitted != 20 {
			t.Fatalf("round %d: %d of 64 admitted on a fresh counter of 20, want 20", round, admitted)
		}
	}
}
