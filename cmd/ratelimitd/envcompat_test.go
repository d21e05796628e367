package main

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/redis/go-redis/v9"

	"github.com/ratelimitd/ratelimitd/internal/incumbentenv"
	"github.com/ratelimitd/ratelimitd/internal/redisstore/redistest"
)

// TestEnvoyproxyEnvironment starts ratelimitd with the environment of
// envoyproxy/ratelimit's integration tests and nothing else but
// RATELIMITD_ENV_COMPAT: it finds the rules under RUNTIME_ROOT, listens
// on PORT and GRPC_PORT, and decides them in the Redis of REDIS_URL, the
// per-second counters in that of REDIS_PERSECOND_URL; the
// variables it ignores are listed; one it cannot honour is a startup
// error naming it.
func TestEnvoyproxyEnvironment(t *testing.T) {
	srv, perSecond := redistest.Start(t), redistest.Start(t)
	admin := srv.Client()
	if err := admin.ConfigSet(context.Background(), "requirepass", "password123").Err(); err != nil {
		t.Fatal(err)
	}
	root := t.TempDir()
	cfg := filepath.Join(root, "ratelimit", "config")
	if err := os.MkdirAll(cfg, 0o700); err != nil {
		t.Fatal(err)
	}
	for name, body := range map[string]string{
		"basic.yaml":   "domain: basic\ndescriptors:\n  - key: key1\n    rate_limit: {unit: second, requests_per_unit: 50}\n",
		"another.yaml": "domain: another\ndescriptors:\n  - key: key2\n    rate_limit: {unit: minute, requests_per_unit: 20}\n",
	} {
		if err := os.WriteFile(filepath.Join(cfg, name), []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	_, httpPort, _ := net.SplitHostPort(freeAddr(t))
	_, grpcPort, _ := net.SplitHostPort(freeAddr(t))
	vars := map[string]string{
		"RATELIMITD_ENV_COMPAT":          "envoyproxy",
		"REDIS_SOCKET_TYPE":              "tcp",
		"REDIS_URL":                      srv.Addr(),
		"REDIS_AUTH":                     "password123",
		"RUNTIME_ROOT":                   root,
		"RUNTIME_SUBDIRECTORY":           "ratelimit",
		"RUNTIME_WATCH_ROOT":             "false",
		"USE_STATSD":                     "false",
		"LOG_LEVEL":                      "DEBUG",
		"HOST":                           "127.0.0.1",
		"PORT":                           httpPort,
		"GRPC_HOST":                      "127.0.0.1",
		"GRPC_PORT":                      grpcPort,
		"LOCAL_CACHE_SIZE_IN_BYTES":      "1048576",
		"REDIS_PERSECOND":                "true",
		"REDIS_PERSECOND_SOCKET_TYPE":    "tcp",
		"REDIS_PERSECOND_URL":            perSecond.Addr(),
		"LIMIT_RESPONSE_HEADERS_ENABLED": "true",
		"LIMIT_REMAINING_HEADER":         "X-RL-Remaining",
	}
	var log syncBuffer
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx, nil, env(vars), &log, &log) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("run: %v", err)
		}
	})
	getWithin(t, "http://127.0.0.1:"+httpPort+"/healthcheck", &log)
	client := rlsv3.NewRateLimitServiceClient(dial(t, "127.0.0.1:"+grpcPort))
	ask := func(domain, key string) *rlsv3.RateLimitResponse {
		t.Helper()
		r, err := client.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: domain,
			Descriptors: []*rlcommon.RateLimitDescriptor{desc(key, "v")}})
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	if r := ask("basic", "key1"); r.GetStatuses()[0].GetLimitRemaining() != 49 {
		t.Errorf("basic/key1: %v, want 49 remaining", r)
	} else if h := r.GetResponseHeadersToAdd(); len(h) != 3 || h[0].GetKey() != "RateLimit-Limit" || h[1].GetKey() != "X-RL-Remaining" || h[1].GetValue() != "49" {
		t.Errorf("basic/key1 headers: %v, want RateLimit-Limit and X-RL-Remaining: 49 (LIMIT_REMAINING_HEADER)", h)
	}
	// 25 calls in one minute window, however slowly a crowded machine
	// makes them.
	redistest.AwayFromWindowEnd(time.Minute, 20*time.Second)
	for i := range 25 {
		r := ask("another", "key2")
		if want := i >= 20; (r.GetOverallCode() == rlsv3.RateLimitResponse_OVER_LIMIT) != want {
			t.Fatalf("another/key2 call %d: %v", i+1, r.GetOverallCode())
		}
	}
	// Decided in that Redis, with REDIS_AUTH.
	authed := redis.NewClient(&redis.Options{Addr: srv.Addr(), Password: "password123"})
	defer authed.Close()
	// The per-minute counter in REDIS_URL's Redis, the per-second one in
	// REDIS_PERSECOND_URL's.
	if n, err := authed.DBSize(context.Background()).Result(); err != nil || n != 1 {
		t.Errorf("%d keys in the main Redis, %v; want the per-minute counter", n, err)
	}
	if n, err := perSecond.Client().DBSize(context.Background()).Result(); err != nil || n != 1 {
		t.Errorf("%d keys in the per-second Redis, %v; want the per-second counter", n, err)
	}
	if strings.Contains(log.String(), "RUNTIME_WATCH_ROOT") {
		t.Errorf("RUNTIME_WATCH_ROOT, honoured, listed as ignored:\n%s", log.String())
	}
	if !strings.Contains(log.String(), "level=DEBUG") {
		t.Errorf("LOG_LEVEL=DEBUG not applied")
	}

	// What it cannot honour is a startup error naming the variable.
	for name, val := range map[string]string{"BACKEND_TYPE": "memcache", "CONFIG_TYPE": "GRPC_XDS_DELTA", "REDIS_SENTINEL_AUTH": "x"} {
		bad := map[string]string{"RATELIMITD_ENV_COMPAT": "envoyproxy", "RUNTIME_ROOT": root, "RUNTIME_SUBDIRECTORY": "ratelimit", name: val,
			"HOST": "127.0.0.1", "PORT": "0", "GRPC_HOST": "127.0.0.1", "GRPC_PORT": "0"}
		// Bounded, should the variable be taken and the service start.
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		err := run(ctx, nil, env(bad), &syncBuffer{}, &syncBuffer{})
		cancel()
		if err == nil || !strings.Contains(err.Error(), name) {
			t.Errorf("%s=%s: %v, want a startup error naming it", name, val, err)
		}
	}
	// Without --env-compat the incumbent's variables mean nothing.
	if err := run(context.Background(), nil, env(map[string]string{"RUNTIME_ROOT": root, "RUNTIME_SUBDIRECTORY": "ratelimit"}), &syncBuffer{}, &syncBuffer{}); err == nil || !strings.Contains(err.Error(), "--config is required") {
		t.Errorf("without --env-compat: %v", err)
	}
}

// TestEnvoyproxyTableInReadme: every variable --env-compat reads is in
// docs/migrating.md.
func TestEnvoyproxyTableInReadme(t *testing.T) {
	readme, err := os.ReadFile("../../docs/migrating.md")
	if err != nil {
		t.Fatal(err)
	}
	names := []string{"REDIS_URL", "REDIS_TYPE", "REDIS_SOCKET_TYPE", "REDIS_TLS", "REDIS_AUTH", "RUNTIME_ROOT",
		"RUNTIME_SUBDIRECTORY", "RUNTIME_APPDIRECTORY", "HOST", "PORT", "GRPC_HOST", "GRPC_PORT", "DEBUG_HOST",
		"DEBUG_PORT", "LOG_LEVEL", "LIMIT_RESPONSE_HEADERS_ENABLED", "GRPC_SERVER_USE_TLS", "USE_STATSD", "STATSD_HOST",
		"STATSD_PORT", "STATSD_PROTOCOL", "DISABLE_STATS", "USE_PROMETHEUS", "PROMETHEUS_ADDR", "PROMETHEUS_PATH", "PROMETHEUS_MAPPER_YAML",
		"USE_DOG_STATSD", "USE_DOG_STATSD_MOGRIFIERS"}
	for _, e := range append(incumbentenv.Settings, incumbentenv.XDS...) {
		names = append(names, e.Name)
	}
	names = append(names, "CONFIG_GRPC_XDS_SERVER_URL")
	for _, n := range names {
		if !strings.Contains(string(readme), "`"+n+"`") {
			t.Errorf("docs/migrating.md lacks %s", n)
		}
	}
}
