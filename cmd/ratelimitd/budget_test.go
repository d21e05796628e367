package main

import (
	"context"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	rlsconf "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/ratelimitd/ratelimitd/internal/redisstore/redistest"
	"github.com/ratelimitd/ratelimitd/internal/xds/xdstest"
)

const budgetYAML = "domain: llm\ndescriptors:\n  - key: user\n    rate_limit: {unit: hour, requests_per_unit: 1000}\n"

// budgetSequence is the token budget's sequence as Envoy AI Gateway
// drives it: a check with hits_addend 0 at the request, a charge of the
// response's tokens at stream end. The charge that crosses the budget is
// recorded, so every later check is OVER_LIMIT.
func budgetSequence(t *testing.T, client rlsv3.RateLimitServiceClient, user string) {
	t.Helper()
	steps := []struct {
		hits      uint64
		want      rlsv3.RateLimitResponse_Code
		remaining uint32
	}{
		{0, rlsv3.RateLimitResponse_OK, 1000},
		{900, rlsv3.RateLimitResponse_OK, 100},
		{500, rlsv3.RateLimitResponse_OVER_LIMIT, 0},
		{0, rlsv3.RateLimitResponse_OVER_LIMIT, 0},
		{500, rlsv3.RateLimitResponse_OVER_LIMIT, 0},
		{0, rlsv3.RateLimitResponse_OVER_LIMIT, 0},
	}
	for i, s := range steps {
		d := desc("user", user)
		d.HitsAddend = wrapperspb.UInt64(s.hits)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		r, err := client.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "llm", Descriptors: []*rlcommon.RateLimitDescriptor{d}})
		cancel()
		if err != nil {
			t.Fatalf("step %d (hits %d): %v", i, s.hits, err)
		}
		if r.GetOverallCode() != s.want || r.GetStatuses()[0].GetLimitRemaining() != s.remaining {
			t.Fatalf("step %d (hits %d): %v, want %v with %d left", i, s.hits, r, s.want, s.remaining)
		}
	}
}

// incumbentProc is this binary run as `ratelimit`.
type incumbentProc struct {
	grpcAddr, httpAddr string
	pid                int
	log                *syncBuffer
}

// runAsIncumbent runs this binary as `ratelimit` in the incumbent's
// environment (plus vars, which win), with args, until the test ends and
// returns it once it is healthy.
func runAsIncumbent(t *testing.T, vars map[string]string, args ...string) incumbentProc {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(t.TempDir(), "ratelimit")
	if err := os.Symlink(exe, bin); err != nil {
		t.Fatal(err)
	}
	_, httpPort, _ := net.SplitHostPort(freeAddr(t))
	_, grpcPort, _ := net.SplitHostPort(freeAddr(t))
	cmd := exec.Command(bin, args...)
	cmd.Env = []string{"RATELIMITD_TEST_AS_MAIN=1", "PATH=" + os.Getenv("PATH"), "HOME=" + t.TempDir(),
		"HOST=127.0.0.1", "PORT=" + httpPort, "GRPC_HOST=127.0.0.1", "GRPC_PORT=" + grpcPort, "USE_STATSD=false"}
	for k, v := range vars {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	var log syncBuffer
	cmd.Stdout, cmd.Stderr = &log, &log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case err := <-exited:
			if err != nil {
				t.Errorf("ratelimit exited with %v\n%s", err, log.String())
			}
		case <-time.After(20 * time.Second):
			_ = cmd.Process.Kill()
			t.Errorf("ratelimit still running 20 s after SIGTERM\n%s", log.String())
		}
	})
	getWithin(t, "http://127.0.0.1:"+httpPort+"/healthcheck", &log)
	return incumbentProc{grpcAddr: "127.0.0.1:" + grpcPort, httpAddr: "127.0.0.1:" + httpPort, pid: cmd.Process.Pid, log: &log}
}

// TestTokenBudget holds the sequence through the binary named ratelimit
// with the incumbent's environment (rules from files and over xDS) and
// with native flags, with the local over-limit cache off and on: usage
// is never lost, with no configuration beyond the rules.
func TestTokenBudget(t *testing.T) {
	srv := redistest.Start(t)
	redistest.AwayFromHourEnd(10 * time.Second)
	root := incumbentRules(t, budgetYAML)
	mgmt := xdstest.Start(t, "127.0.0.1:0")
	mgmt.Set("budget-node", "1", &rlsconf.RateLimitConfig{Name: "llm", Domain: "llm", Descriptors: []*rlsconf.RateLimitDescriptor{
		{Key: "user", RateLimit: &rlsconf.RateLimitPolicy{Unit: rlsconf.RateLimitUnit_HOUR, RequestsPerUnit: 1000}}}})
	for _, cache := range []string{"0", "1048576"} {
		t.Run("incumbent env, files, cache "+cache, func(t *testing.T) {
			addr := runAsIncumbent(t, map[string]string{"REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": srv.Addr(),
				"RUNTIME_ROOT": root, "RUNTIME_SUBDIRECTORY": "ratelimit", "LOCAL_CACHE_SIZE_IN_BYTES": cache})
			budgetSequence(t, rlsv3.NewRateLimitServiceClient(dial(t, addr.grpcAddr)), "files-"+cache)
		})
		t.Run("incumbent env, xDS, cache "+cache, func(t *testing.T) {
			addr := runAsIncumbent(t, map[string]string{"REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": srv.Addr(),
				"CONFIG_TYPE": "GRPC_XDS_SOTW", "CONFIG_GRPC_XDS_SERVER_URL": mgmt.Addr, "CONFIG_GRPC_XDS_NODE_ID": "budget-node",
				"LOCAL_CACHE_SIZE_IN_BYTES": cache})
			budgetSequence(t, rlsv3.NewRateLimitServiceClient(dial(t, addr.grpcAddr)), "xds-"+cache)
		})
		t.Run("native flags, cache "+cache, func(t *testing.T) {
			in := start(t, env(nil), "--config", writeRules(t, budgetYAML), "--redis-url", srv.URL(), "--redis-timeout", "2s", "--local-cache-size", cache)
			budgetSequence(t, rlsv3.NewRateLimitServiceClient(dial(t, in.grpcAddr)), "native-"+cache)
		})
	}
}
