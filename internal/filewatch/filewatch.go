// Package filewatch calls a function when files change on disk: in-place
// writes, an editor's write-and-rename, a symlink swapped (ln -sfn), and a
// Kubernetes ConfigMap or Secret update (the "..data" symlink swap inside
// the mounted directory). It is what cert-manager and kubelet do to the
// certificate files ratelimitd serves.
package filewatch

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/fsnotify/fsnotify"
)

// DefaultDebounce is how long Watch waits after the last event before it
// calls back, so that a burst of writes, renames and swaps gives one call.
const DefaultDebounce = 200 * time.Millisecond

// New returns a watcher of paths: of each one's parent directory and, for
// a directory, of the directory itself, non-recursively. A file replaced
// by rename, or reached through a symlink that is swapped, leaves no
// watch behind on a file that no longer exists; its directory sees it
// all. For callers that act on every event; Watch debounces them.
func New(paths []string) (*fsnotify.Watcher, error) {
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return nil, fmt.Errorf("filewatch: %w", err)
	}
	seen := map[string]bool{}
	for _, p := range paths {
		dirs := []string{filepath.Dir(filepath.Clean(p))}
		if st, err := os.Stat(p); err == nil && st.IsDir() {
			dirs = append(dirs, p)
		}
		for _, d := range dirs {
			if seen[d] {
				continue
			}
			seen[d] = true
			if err := w.Add(d); err != nil {
				w.Close()
				return nil, fmt.Errorf("filewatch: watch %s: %w", d, err)
			}
		}
	}
	return w, nil
}

// Watch calls changed after each burst of events at paths, until ctx is
// done; changed runs on Watch's goroutine. It watches what New does. It
// returns an error only when it cannot start watching; a later watcher
// error is passed to onError.
func Watch(ctx context.Context, paths []string, debounce time.Duration, changed func(), onError func(error)) error {
	if debounce <= 0 {
		debounce = DefaultDebounce
	}
	w, err := New(paths)
	if err != nil {
		return err
	}
	defer w.Close()
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case _, ok := <-w.Events:
			if !ok {
				return nil
			}
			timer.Reset(debounce)
		case err, ok := <-w.Errors:
			if !ok {
				return nil
			}
			if onError != nil {
				onError(fmt.Errorf("filewatch: %w", err))
			}
		case <-timer.C:
			changed()
		}
	}
}
