package config

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

type loads struct {
	mu    sync.Mutex
	snaps []*Snapshot
	errs  []error
}

func (l *loads) add(s *Snapshot, err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if err != nil {
		l.errs = append(l.errs, err)
	} else {
		l.snaps = append(l.snaps, s)
	}
}

func (l *loads) wait(t *testing.T, snaps, errs int) {
	t.Helper()
	deadline := time.Now().Add(3 * time.Second)
	for {
		l.mu.Lock()
		ok := len(l.snaps) >= snaps && len(l.errs) >= errs
		l.mu.Unlock()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after 3s: %d loads, %d errors; want %d, %d", len(l.snaps), len(l.errs), snaps, errs)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func rule(limit string) string {
	return "domain: w\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: " + limit + "}\n"
}

func watchFor(t *testing.T, path string) *loads {
	t.Helper()
	first, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	l := &loads{}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Watch(ctx, []string{path}, Options{}, 50*time.Millisecond, first.Hash, l.add) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
	time.Sleep(50 * time.Millisecond) // watches in place
	return l
}

func TestWatchInPlaceRenameAndInvalid(t *testing.T) {
	dir := t.TempDir()
	f := filepath.Join(dir, "rules.yaml")
	os.WriteFile(f, []byte(rule("5")), 0o600)
	l := watchFor(t, dir)
	os.WriteFile(f, []byte(rule("2")), 0o600)
	l.wait(t, 1, 0)
	if got := l.snaps[0].Domain("w").Rules()[0].Limit.RequestsPerUnit; got != 2 {
		t.Errorf("reloaded limit %d, want 2", got)
	}
	// An editor's write: a temporary file renamed over the original.
	tmp := filepath.Join(dir, ".rules.yaml.swp")
	os.WriteFile(tmp, []byte(rule("3")), 0o600)
	os.Rename(tmp, f)
	l.wait(t, 2, 0)
	os.WriteFile(f, []byte("domain: w\ndescriptors: [\n"), 0o600)
	l.wait(t, 2, 1)
	if !strings.Contains(l.errs[0].Error(), "rules.yaml") {
		t.Errorf("error does not name the file: %v", l.errs[0])
	}
}

// TestWatchFixBackToTheRulesInForce: a bad edit fails to load; writing
// the rules in force back is reported as a load, though nothing changed,
// so that the failure is not the last word (the server logs "rules
// reloaded" and counts a success).
func TestWatchFixBackToTheRulesInForce(t *testing.T) {
	dir := t.TempDir()
	f := filepath.Join(dir, "rules.yaml")
	os.WriteFile(f, []byte(rule("5")), 0o600)
	l := watchFor(t, dir)
	os.WriteFile(f, []byte("domain: w\ndescriptors: [\n"), 0o600)
	l.wait(t, 0, 1)
	os.WriteFile(f, []byte(rule("5")), 0o600)
	l.wait(t, 1, 1)
	// Written again unchanged once it loaded: nothing to tell.
	os.WriteFile(f, []byte(rule("5")), 0o600)
	time.Sleep(300 * time.Millisecond)
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.snaps) != 1 {
		t.Errorf("%d loads reported; an unchanged file after a good load is not one", len(l.snaps))
	}
}

// TestWatchSymlinkSwap swaps a symlinked rules directory the way
// Kubernetes updates a ConfigMap volume and `ln -sfn` deployments do.
func TestWatchSymlinkSwap(t *testing.T) {
	root := t.TempDir()
	for _, v := range []string{"v1", "v2"} {
		os.Mkdir(filepath.Join(root, v), 0o700)
	}
	os.WriteFile(filepath.Join(root, "v1", "rules.yaml"), []byte(rule("5")), 0o600)
	os.WriteFile(filepath.Join(root, "v2", "rules.yaml"), []byte(rule("7")), 0o600)
	current := filepath.Join(root, "current")
	os.Symlink("v1", current)
	l := watchFor(t, current)
	tmp := filepath.Join(root, ".current.tmp")
	os.Symlink("v2", tmp)
	if err := os.Rename(tmp, current); err != nil {
		t.Fatal(err)
	}
	l.wait(t, 1, 0)
	if got := l.snaps[0].Domain("w").Rules()[0].Limit.RequestsPerUnit; got != 7 {
		t.Errorf("after the swap the limit is %d, want 7", got)
	}
}

func TestWatchConfigMapLayout(t *testing.T) {
	// A ConfigMap volume: rules.yaml -> ..data/rules.yaml, ..data -> ..v1.
	mount := t.TempDir()
	for _, v := range []string{"..v1", "..v2"} {
		os.Mkdir(filepath.Join(mount, v), 0o700)
	}
	os.WriteFile(filepath.Join(mount, "..v1", "rules.yaml"), []byte(rule("5")), 0o600)
	os.WriteFile(filepath.Join(mount, "..v2", "rules.yaml"), []byte(rule("9")), 0o600)
	os.Symlink("..v1", filepath.Join(mount, "..data"))
	os.Symlink(filepath.Join("..data", "rules.yaml"), filepath.Join(mount, "rules.yaml"))
	l := watchFor(t, mount)
	os.Symlink("..v2", filepath.Join(mount, "..data_tmp"))
	os.Rename(filepath.Join(mount, "..data_tmp"), filepath.Join(mount, "..data"))
	l.wait(t, 1, 0)
	if got := l.snaps[0].Domain("w").Rules()[0].Limit.RequestsPerUnit; got != 9 {
		t.Errorf("after the ConfigMap update the limit is %d, want 9", got)
	}
}
