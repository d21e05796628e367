package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/ratelimitd/ratelimitd/internal/redisstore/redistest"
)

// layoutRules is the one rule of the layouts' tests, n a minute.
func layoutRules(n int) string {
	return fmt.Sprintf("domain: layout\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: %d}\n", n)
}

// mustWrite writes body to path, making its directories.
func mustWrite(t *testing.T, path, body string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
}

// swapLink points the symlink link at target as the incumbent's docs and
// kubelet do: a new link renamed over the old one, atomically.
func swapLink(t *testing.T, target, link string) {
	t.Helper()
	tmp := link + ".tmp"
	if err := os.Symlink(target, tmp); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, link); err != nil {
		t.Fatal(err)
	}
}

// servesLimit waits (10 s at most, without a signal) until the service
// at addr answers the layout rule with limit n, and until its log has
// said "rules reloaded" reloads times.
func servesLimit(t *testing.T, addr string, log *syncBuffer, n uint32, reloads int, what string) {
	t.Helper()
	client := rlsv3.NewRateLimitServiceClient(dial(t, addr))
	eventuallyWithin(t, 10*time.Second, what, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		r, err := client.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "layout", Descriptors: []*rlcommon.RateLimitDescriptor{desc("k", "v")}})
		if err != nil {
			return err
		}
		got := r.GetStatuses()[0].GetCurrentLimit().GetRequestsPerUnit()
		if got != n {
			return fmt.Errorf("limit %d, want %d", got, n)
		}
		if c := strings.Count(log.String(), "rules reloaded"); c != reloads {
			return fmt.Errorf("%d reloads logged, want %d", c, reloads)
		}
		return nil
	})
}

// configMap lays out a Kubernetes ConfigMap volume at dir holding the
// rule of limit n: rules.yaml -> ..data/rules.yaml, ..data -> ..v<n>.
func configMap(t *testing.T, dir string, n int) {
	t.Helper()
	version := fmt.Sprintf("..v%d", n)
	mustWrite(t, filepath.Join(dir, version, "rules.yaml"), layoutRules(n))
	if _, err := os.Lstat(filepath.Join(dir, "rules.yaml")); err != nil {
		if err := os.Symlink(filepath.Join("..data", "rules.yaml"), filepath.Join(dir, "rules.yaml")); err != nil {
			t.Fatal(err)
		}
	}
	swapLink(t, version, filepath.Join(dir, "..data"))
}

// TestReloadLayouts: the rules reload, without a signal and within 10 s,
// in every layout ops deploy them: the incumbent's RUNTIME_ROOT symlink
// swapped (atomic rename of a new link, then ln -sfn), with an edit in
// the directory it now leads to; RUNTIME_WATCH_ROOT=false's edits in the
// config directory; a ConfigMap's "..data" swap with native flags and
// under the incumbent's environment; and a --config symlink swapped.
func TestReloadLayouts(t *testing.T) {
	srv := redistest.Start(t)
	incumbent := map[string]string{"REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": srv.Addr(), "RUNTIME_SUBDIRECTORY": "ratelimit"}
	t.Run("incumbent symlink swap", func(t *testing.T) {
		root := t.TempDir()
		for _, v := range []int{1, 2, 4} {
			mustWrite(t, filepath.Join(root, fmt.Sprint("v", v), "ratelimit", "config", "rules.yaml"), layoutRules(v))
		}
		current := filepath.Join(root, "current")
		swapLink(t, "v1", current)
		vars := map[string]string{"RUNTIME_ROOT": current}
		for k, v := range incumbent {
			vars[k] = v
		}
		p := runAsIncumbent(t, vars) // RUNTIME_WATCH_ROOT unset: its default, true
		servesLimit(t, p.grpcAddr, p.log, 1, 0, "the rules under v1")
		swapLink(t, "v2", current)
		servesLimit(t, p.grpcAddr, p.log, 2, 1, "the rules after current was renamed to v2")
		// The directory the link leads to now is the one watched.
		mustWrite(t, filepath.Join(root, "v2", "ratelimit", "config", "rules.yaml"), layoutRules(3))
		servesLimit(t, p.grpcAddr, p.log, 3, 2, "an edit in v2 after the swap")
		if out, err := exec.Command("ln", "-sfn", "v4", current).CombinedOutput(); err != nil {
			t.Fatalf("ln -sfn: %v: %s", err, out)
		}
		servesLimit(t, p.grpcAddr, p.log, 4, 3, "the rules after ln -sfn v4 current")
		if strings.Contains(p.log.String(), "RUNTIME_WATCH_ROOT") {
			t.Errorf("RUNTIME_WATCH_ROOT is listed as ignored:\n%s", p.log.String())
		}
	})
	t.Run("incumbent config directory, RUNTIME_WATCH_ROOT=false", func(t *testing.T) {
		root := t.TempDir()
		file := filepath.Join(root, "ratelimit", "config", "rules.yaml")
		mustWrite(t, file, layoutRules(1))
		vars := map[string]string{"RUNTIME_ROOT": root, "RUNTIME_WATCH_ROOT": "false"}
		for k, v := range incumbent {
			vars[k] = v
		}
		p := runAsIncumbent(t, vars)
		servesLimit(t, p.grpcAddr, p.log, 1, 0, "the first rules")
		mustWrite(t, file, layoutRules(2))
		servesLimit(t, p.grpcAddr, p.log, 2, 1, "an edit in the config directory")
	})
	t.Run("ConfigMap, native flags", func(t *testing.T) {
		mount := t.TempDir()
		configMap(t, mount, 1)
		in := start(t, env(nil), "--config", mount, "--redis-url", srv.URL())
		servesLimit(t, in.grpcAddr, in.log, 1, 0, "the first rules")
		configMap(t, mount, 2)
		servesLimit(t, in.grpcAddr, in.log, 2, 1, "the rules after the ..data swap")
	})
	t.Run("ConfigMap, incumbent environment", func(t *testing.T) {
		root := t.TempDir()
		mount := filepath.Join(root, "ratelimit", "config")
		configMap(t, mount, 1)
		vars := map[string]string{"RUNTIME_ROOT": root}
		for k, v := range incumbent {
			vars[k] = v
		}
		p := runAsIncumbent(t, vars)
		servesLimit(t, p.grpcAddr, p.log, 1, 0, "the first rules")
		configMap(t, mount, 2)
		servesLimit(t, p.grpcAddr, p.log, 2, 1, "the rules after the ..data swap")
	})
	t.Run("--config symlink swapped", func(t *testing.T) {
		root := t.TempDir()
		for _, v := range []int{1, 2} {
			mustWrite(t, filepath.Join(root, fmt.Sprint("v", v), "rules.yaml"), layoutRules(v))
		}
		link := filepath.Join(root, "current")
		swapLink(t, "v1", link)
		in := start(t, env(nil), "--config", link, "--redis-url", srv.URL())
		servesLimit(t, in.grpcAddr, in.log, 1, 0, "the rules under v1")
		swapLink(t, "v2", link)
		servesLimit(t, in.grpcAddr, in.log, 2, 1, "the rules after the swap")
		mustWrite(t, filepath.Join(root, "v2", "rules.yaml"), layoutRules(3))
		servesLimit(t, in.grpcAddr, in.log, 3, 2, "an edit in v2 after the swap")
	})
}
