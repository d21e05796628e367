package filewatch

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestWatchWriteAndRename: a write in place and a file renamed over each
// give a call, and Watch returns once ctx is done. (The "..data" swap of
// a Secret volume: cmd/ratelimitd's TestCertificateRotation.)
func TestWatchWriteAndRename(t *testing.T) {
	dir := t.TempDir()
	f := filepath.Join(dir, "tls.crt")
	if err := os.WriteFile(f, []byte("a"), 0o600); err != nil {
		t.Fatal(err)
	}
	calls := make(chan struct{}, 16)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- Watch(ctx, []string{f}, 20*time.Millisecond, func() { calls <- struct{}{} }, func(err error) { t.Error(err) })
	}()
	wait := func(what string) {
		t.Helper()
		select {
		case <-calls:
		case <-time.After(5 * time.Second):
			t.Fatalf("%s: no call within 5 s", what)
		}
	}
	// fsnotify registers asynchronously: write until the first call.
	deadline := time.Now().Add(5 * time.Second)
	for len(calls) == 0 && time.Now().Before(deadline) {
		if err := os.WriteFile(f, []byte("b"), 0o600); err != nil {
			t.Fatal(err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	wait("in-place write")
	for len(calls) > 0 {
		<-calls
	}
	tmp := f + ".tmp"
	if err := os.WriteFile(tmp, []byte("c"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, f); err != nil {
		t.Fatal(err)
	}
	wait("rename over")
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
