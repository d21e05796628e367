package config

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/ratelimitd/ratelimitd/config/rulestest"
)

// TestBombsBounded: each bomb is refused within 2 s, allocating under
// 200 MB in all, with an error of bounded length that says why.
func TestBombsBounded(t *testing.T) {
	tests := []struct {
		name    string
		wantErr string
	}{
		{"metadata_40k", "metadata: more than 10000 YAML nodes"},
		{"metadata_160k", "metadata: more than 10000 YAML nodes"},
		{"metadata_alias", "metadata: more than 10000 YAML nodes"},
		{"descriptor_alias", "more problems not shown"},
		{"path_long_key", "descriptors[0].key: 100000 bytes, more than the 4096 allowed"},
		{"path_deep", "more problems not shown"},
		{"walk_alias", "excessive aliasing"},
		{"flow_nodes", "too large: up to"},
	}
	bombs := rulestest.Bombs()
	dir := t.TempDir()
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := filepath.Join(dir, tt.name+".yaml")
			if err := os.WriteFile(p, bombs[tt.name], 0o600); err != nil {
				t.Fatal(err)
			}
			runtime.GC()
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			start := cpuTime(t)
			_, err := Load(p)
			took := cpuTime(t) - start
			runtime.ReadMemStats(&after)
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("Load = %.300v, want an error containing %q", err, tt.wantErr)
			}
			if n := len(err.Error()); n > 64<<10 {
				t.Errorf("error is %d bytes", n)
			}
			if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 200<<20 {
				t.Errorf("allocated %d MB", alloc>>20)
			}
			if took > 2*time.Second && !raceEnabled {
				t.Errorf("took %v of CPU", took)
			}
			t.Logf("%d bytes: %v of CPU, %d MB allocated, %d-byte error", len(bombs[tt.name]), took.Round(time.Millisecond), (after.TotalAlloc-before.TotalAlloc)>>20, len(err.Error()))
		})
	}
}

// TestEstimateNodesBounds: the estimate never falls below the nodes the
// YAML library builds, whatever the style.
func TestEstimateNodesBounds(t *testing.T) {
	for _, doc := range []string{
		"a", "a: b", "a:", "? a", "? a\n: b", "[a, b, c]", "{a, b: c, d}", "[]", "{}", "- - - a", "- [a, {b: [c]}]",
		"a: &x [1, 2]\nb: *x", "a: |\n  text\n  more\n", "- !!str 1\n- !!int 2", "{a: [b, {c: d}], e: f}",
		"domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n",
	} {
		var n yaml.Node
		if err := yaml.Unmarshal([]byte(doc), &n); err != nil {
			t.Fatalf("%q: %v", doc, err)
		}
		if got, est := countNodes(&n), estimateNodes([]byte(doc)); est < got {
			t.Errorf("%q: estimate %d below the %d nodes built", doc, est, got)
		}
	}
}

func countNodes(n *yaml.Node) int {
	c := 0
	if n.Kind != yaml.DocumentNode {
		c++
	}
	for _, k := range n.Content {
		c += countNodes(k)
	}
	return c
}

// TestLoadCanceled: a load stops once its context is done, between files
// and within one.
func TestLoadCanceled(t *testing.T) {
	body := rulestest.Bombs()["walk_alias"]
	p := filepath.Join(t.TempDir(), "walk.yaml")
	if err := os.WriteFile(p, body, 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := LoadContext(ctx, p); err == nil || !strings.Contains(err.Error(), "load stopped before") {
		t.Errorf("LoadContext(canceled) = %v", err)
	}
	if _, err := parseDoc(ctx, Doc{Name: p, Data: body, Lines: true}); err == nil || !strings.Contains(err.Error(), "parse stopped: context canceled") {
		t.Errorf("parseDoc(canceled) = %.300v", err)
	}
}

// TestUnreadableRulesFile: a *.yaml in a rules directory that cannot be
// read (a dangling link, a loop) is an error naming it, not skipped, and
// one that is not a regular file is refused without being opened.
func TestUnreadableRulesFile(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "good.yaml"), []byte("domain: d\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for name, target := range map[string]string{"dangling.yaml": "nowhere.yaml", "loop.yaml": "loop.yaml"} {
		if err := os.Symlink(filepath.Join(dir, target), filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	// A FIFO would block the load until a writer came.
	if err := syscall.Mkfifo(filepath.Join(dir, "fifo.yaml"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := Load(dir)
	for _, want := range []string{"dangling.yaml: unreadable rules file", "loop.yaml: unreadable rules file", "fifo.yaml: not a regular file"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Load = %v, want %q", err, want)
		}
	}
}

// TestFileSizeCapExact: a rules file of exactly MaxFileSize bytes is read
// whole and parsed; one byte more is refused for its size, never cut at
// the cap and parsed (which would load a different file than the one on
// disk, or fail with a misleading YAML error).
func TestFileSizeCapExact(t *testing.T) {
	dir := t.TempDir()
	head := "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n"
	// A comment fills the file up to the size wanted; the last line ends
	// it, and cut one byte short it would still be valid YAML.
	file := func(size int) string {
		body := head + "#" + strings.Repeat("x", size-len(head)-2) + "\n"
		p := filepath.Join(dir, "rules.yaml")
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	if _, err := Load(file(MaxFileSize)); err != nil {
		t.Errorf("a file of exactly %d bytes: %v", MaxFileSize, err)
	}
	_, err := Load(file(MaxFileSize + 1))
	if err == nil || !strings.Contains(err.Error(), "more than the 4194304 bytes allowed") {
		t.Errorf("a file one byte over the cap: %v, want it refused for its size", err)
	}
}

// TestMetadataChargedToWalk: metadata nodes count against the file's walk
// budget, not only each rule's own: many rules whose metadata each stay
// under MaxMetadataNodes, through one alias, add up to more than
// MaxWalkNodes and are refused as excessive aliasing, quickly.
func TestMetadataChargedToWalk(t *testing.T) {
	var b strings.Builder
	// &m expands to 1 + 7*(1 + 10*(1 + 10*(1 + 10))): 7,778 nodes, under
	// the 10,000 a rule's metadata may hold.
	b.WriteString("domain: d\ndescriptors:\n  - key: k0\n    metadata:\n      a: &a [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]\n")
	b.WriteString("      b: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a, *a]\n")
	b.WriteString("      c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b, *b]\n")
	b.WriteString("      m: &m [*c, *c, *c, *c, *c, *c, *c]\n")
	const rules = 400 // 400 x ~8,000 nodes: past the 1,000,000 walk budget
	for i := 1; i <= rules; i++ {
		fmt.Fprintf(&b, "  - key: k%d\n    metadata: {m: *m}\n", i)
	}
	start := cpuTime(t)
	_, err := Parse("meta.yaml", []byte(b.String()))
	if err == nil || !strings.Contains(err.Error(), "excessive aliasing") {
		t.Fatalf("Parse = %.300v, want excessive aliasing", err)
	}
	if took := cpuTime(t) - start; took > 5*time.Second && !raceEnabled {
		t.Errorf("took %v of CPU", took)
	}
}

// cpuTime is the CPU the test process has used: a bound on it holds on a
// busy machine, where the wall clock also counts the waits for a core.
func cpuTime(t *testing.T) time.Duration {
	t.Helper()
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		t.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
