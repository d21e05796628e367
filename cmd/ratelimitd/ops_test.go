package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
)

func opsRule(limit string) string {
	return "domain: ops\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: " + limit + "}\n"
}

func get(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

// TestHotReload edits the rules while serving: a new limit applies within
// 2 s, invalid YAML keeps the old rules and is counted, and a symlink swap
// of the rules directory reloads.
func TestHotReload(t *testing.T) {
	root := t.TempDir()
	for _, v := range []string{"v1", "v2"} {
		os.Mkdir(filepath.Join(root, v), 0o700)
	}
	file := filepath.Join(root, "v1", "rules.yaml")
	os.WriteFile(file, []byte(opsRule("5")), 0o600)
	os.WriteFile(filepath.Join(root, "v2", "rules.yaml"), []byte(opsRule("7")), 0o600)
	current := filepath.Join(root, "current")
	os.Symlink("v1", current)
	in := start(t, env(nil), "--config", current)
	client := rlsv3.NewRateLimitServiceClient(dial(t, in.grpcAddr))
	limitNow := func() uint32 {
		resp, err := client.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "ops", Descriptors: []*rlcommon.RateLimitDescriptor{desc("k", "v")}})
		if err != nil {
			t.Fatal(err)
		}
		return resp.GetStatuses()[0].GetCurrentLimit().GetRequestsPerUnit()
	}
	waitLimit := func(want uint32, what string) {
		t.Helper()
		deadline := time.Now().Add(2 * time.Second)
		for limitNow() != want {
			if time.Now().After(deadline) {
				t.Fatalf("%s: limit still %d after 2 s, want %d\n%s", what, limitNow(), want, in.log.String())
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	waitLimit(5, "start")
	os.WriteFile(file, []byte(opsRule("2")), 0o600)
	waitLimit(2, "edit 5 -> 2")
	os.WriteFile(file, []byte("domain: ops\ndescriptors: [\n"), 0o600)
	deadline := time.Now().Add(2 * time.Second)
	for !strings.Contains(get(t, "http://"+in.httpAddr+"/metrics"), `ratelimitd_config_reloads_total{result="failure"} 1`) {
		if time.Now().After(deadline) {
			t.Fatalf("invalid rules not counted:\n%s", in.log.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	if got := limitNow(); got != 2 {
		t.Errorf("after invalid YAML the limit is %d, want the old 2", got)
	}
	if !strings.Contains(in.log.String(), "rules.yaml:2: invalid YAML") {
		t.Errorf("the reload error does not name the file:\n%s", in.log.String())
	}
	tmp := filepath.Join(root, ".tmp")
	os.Symlink("v2", tmp)
	os.Rename(tmp, current)
	waitLimit(7, "symlink swap")
	if !strings.Contains(get(t, "http://"+in.httpAddr+"/rlconfig"), "ops.k: unit=hour requests_per_unit=7") {
		t.Error("/rlconfig does not show the new rules")
	}
}

func TestCheckConfig(t *testing.T) {
	var out syncBuffer
	if err := run(context.Background(), []string{"check-config", "../../deploy/rules"}, env(nil), &out, &out); err != nil {
		t.Fatalf("example rules: %v\n%s", err, out.String())
	}
	if !strings.Contains(out.String(), "../../deploy/rules: ok: 1 file(s), 1 domain(s)") {
		t.Errorf("output = %q", out.String())
	}
	bad, _ := filepath.Glob("../../config/testdata/*.bad.yaml")
	if len(bad) < 20 {
		t.Fatalf("only %d bad files", len(bad))
	}
	for _, f := range bad {
		var out syncBuffer
		err := run(context.Background(), []string{"check-config", f}, env(nil), &out, &out)
		if err == nil || !strings.Contains(out.String(), f) {
			t.Errorf("check-config %s: err %v, output %q: want a failure naming the file", f, err, out.String())
		}
	}
	var all syncBuffer
	if err := run(context.Background(), []string{"check-config", "../../deploy/rules", bad[0], bad[1]}, env(nil), &all, &all); err == nil ||
		!strings.Contains(all.String(), bad[0]) || !strings.Contains(all.String(), bad[1]) {
		t.Errorf("several paths: %v\n%s", err, all.String())
	}
	// The paths are one set, as the server's directory is: two files of
	// one domain are refused together, though each alone is fine.
	dir := t.TempDir()
	for _, name := range []string{"a.yaml", "b.yaml"} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte("domain: same\ndescriptors:\n  - key: "+name[:1]+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	var dup syncBuffer
	err := run(context.Background(), []string{"check-config", filepath.Join(dir, "a.yaml"), filepath.Join(dir, "b.yaml")}, env(nil), &dup, &dup)
	if err == nil || !strings.Contains(dup.String(), `duplicate domain "same"`) {
		t.Errorf("two files of one domain as two arguments: %v\n%s", err, dup.String())
	}
}

func TestHealthcheckAndDebug(t *testing.T) {
	debug := freeAddr(t)
	in := start(t, env(nil), "--config", writeRules(t, opsRule("1")), "--debug-addr", debug, "--decision-metadata")
	var out syncBuffer
	if err := run(context.Background(), []string{"healthcheck", "--addr", in.grpcAddr}, env(nil), &out, &out); err != nil || !strings.Contains(out.String(), "SERVING") {
		t.Errorf("healthcheck: %v %q", err, out.String())
	}
	if err := run(context.Background(), []string{"healthcheck", "--addr", freeAddr(t), "--timeout", "300ms"}, env(nil), &out, &out); err == nil {
		t.Error("healthcheck of nothing succeeded")
	}
	if body := get(t, "http://"+debug+"/debug/pprof/"); !strings.Contains(body, "goroutine") {
		t.Errorf("pprof index = %.200q", body)
	}
	client := rlsv3.NewRateLimitServiceClient(dial(t, in.grpcAddr))
	resp, err := client.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "ops",
		Descriptors: []*rlcommon.RateLimitDescriptor{desc("k", "a"), desc("nope", "b")}})
	if err != nil {
		t.Fatal(err)
	}
	got := resp.GetDynamicMetadata().AsMap()["decisions"]
	ds, _ := got.([]any)
	if len(ds) != 2 {
		t.Fatalf("dynamic_metadata decisions = %v", got)
	}
	first, _ := ds[0].(map[string]any)
	// The rule is 1 per hour: the reset is within the hour, in µs.
	if us, _ := first["reset_us"].(float64); us <= 0 || us > 3600e6 {
		t.Errorf("reset_us %v, want the µs to the end of the hour", first["reset_us"])
	}
	delete(first, "reset_us")
	want := `[map[reason:near_limit rule:ops.k] map[reason:no_rule rule:]]`
	if s := fmt.Sprint(got); s != want {
		t.Errorf("dynamic_metadata decisions = %s, want %s", s, want)
	}
}

// TestMergeDomainsFlag: two files of one domain in the rules directory
// are a startup error, unless --merge-domains merges them; check-config
// takes the same flag.
func TestMergeDomainsFlag(t *testing.T) {
	dir := t.TempDir()
	for name, key := range map[string]string{"a.yaml": "a", "b.yaml": "b"} {
		body := "domain: merged\ndescriptors:\n  - key: " + key + "\n    rate_limit: {unit: hour, requests_per_unit: 5}\n"
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	var out syncBuffer
	// Bounded, should the files be merged after all and the service start.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := run(ctx, []string{"--config", dir, "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0"}, env(nil), &out, &out); err == nil || !strings.Contains(err.Error(), `duplicate domain "merged"`) {
		t.Fatalf("without --merge-domains: %v", err)
	}
	var chk syncBuffer
	if err := run(context.Background(), []string{"check-config", "--merge-domains", dir}, env(nil), &chk, &chk); err != nil {
		t.Fatalf("check-config --merge-domains: %v\n%s", err, chk.String())
	}
	in := start(t, env(map[string]string{"RATELIMITD_MERGE_DOMAINS": "true"}), "--config", dir)
	client := rlsv3.NewRateLimitServiceClient(dial(t, in.grpcAddr))
	for _, key := range []string{"a", "b"} {
		resp, err := client.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "merged",
			Descriptors: []*rlcommon.RateLimitDescriptor{desc(key, "v")}})
		if err != nil || resp.GetStatuses()[0].GetCurrentLimit().GetRequestsPerUnit() != 5 {
			t.Errorf("%s: %v, %v; want the limit of its file", key, resp, err)
		}
	}
}

// TestRulesHashFromContents: the rules' hash is computed from the files'
// contents and their names relative to the rules root, so check-config
// in CI and the server print the same hash however the path is spelled
// (relative, absolute, the file itself, through "./" and "..").
func TestRulesHashFromContents(t *testing.T) {
	abs, err := filepath.Abs("../../deploy/rules")
	if err != nil {
		t.Fatal(err)
	}
	hashRE := regexp.MustCompile(`hash ([0-9a-f]{64})\n`)
	var want string
	for _, path := range []string{"../../deploy/rules", abs, "../../deploy/./rules/", "../../deploy/../deploy/rules/example.yaml", filepath.Join(abs, "example.yaml")} {
		var out syncBuffer
		if err := run(context.Background(), []string{"check-config", path}, env(nil), &out, &out); err != nil {
			t.Fatalf("check-config %s: %v\n%s", path, err, out.String())
		}
		m := hashRE.FindStringSubmatch(out.String())
		if m == nil {
			t.Fatalf("check-config %s printed no hash: %q", path, out.String())
		}
		if want == "" {
			want = m[1]
		} else if m[1] != want {
			t.Errorf("check-config %s: hash %s, %s for ../../deploy/rules", path, m[1], want)
		}
	}
	in := start(t, env(nil), "--config", abs)
	if !strings.Contains(in.log.String(), "hash="+want) {
		t.Errorf("the server's hash differs from check-config's %s:\n%s", want, in.log.String())
	}
}
