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
	"strings"
	"time"

	"github.com/fsnotify/fsnotify"
)

// DefaultDebounce is how long Watch waits after the last event before it
// calls back, so that a burst of writes, renames and swaps gives one call.
const DefaultDebounce = 200 * time.Millisecond

// Watcher is an fsnotify watcher of the directories that show every
// change to some paths (see [Dirs]). Its Events and Errors are
// fsnotify's.
type Watcher struct {
	*fsnotify.Watcher
	paths   []string
	watched map[string]bool
}

// New returns a watcher of paths: of each one's parent directory and, for
// a directory, of the directory itself, non-recursively, and of the
// directory holding each symlink on the way to them (see [Dirs]). A file
// replaced by rename, or reached through a symlink that is swapped,
// leaves no watch behind on a file that no longer exists; its directory
// sees it all. For callers that act on every event; Watch debounces
// them. After a burst of events, [Watcher.Refresh] follows a swapped
// symlink to the directories it now leads to.
func New(paths []string) (*Watcher, error) {
	fw, err := fsnotify.NewWatcher()
	if err != nil {
		return nil, fmt.Errorf("filewatch: %w", err)
	}
	w := &Watcher{Watcher: fw, paths: paths, watched: map[string]bool{}}
	for _, d := range Dirs(paths) {
		if err := w.Add(d); err != nil {
			w.Close()
			return nil, fmt.Errorf("filewatch: watch %s: %w", d, err)
		}
		w.watched[d] = true
	}
	return w, nil
}

// Refresh watches the directories paths lead to now and stops watching
// those they no longer do: after a symlink on the way was swapped
// (RUNTIME_ROOT's "current" link, a --config link switched with ln -sfn),
// the old target's directories tell nothing more and the new one's must
// be watched for the edits made there. A directory that cannot be
// watched (gone) is skipped: its parent's watch tells when it is back.
func (w *Watcher) Refresh() {
	now := map[string]bool{}
	for _, d := range Dirs(w.paths) {
		now[d] = true
		if !w.watched[d] && w.Add(d) == nil {
			w.watched[d] = true
		}
	}
	for d := range w.watched {
		if !now[d] {
			_ = w.Remove(d)
			delete(w.watched, d)
		}
	}
}

// Dirs returns the directories, symlinks resolved, whose events show
// every change to paths: each path's parent directory and, for a
// directory, the directory itself; and, for each symlink on the way to a
// path (RUNTIME_ROOT's "current", a ConfigMap's "..data"), the directory
// holding the link, where swapping it is seen. Watched by their resolved
// names, they see the edits made where the links lead now.
func Dirs(paths []string) []string {
	var out []string
	seen := map[string]bool{}
	add := func(d string) {
		if r, err := filepath.EvalSymlinks(d); err == nil {
			d = r
		}
		if !seen[d] {
			seen[d] = true
			out = append(out, d)
		}
	}
	for _, p := range paths {
		p = filepath.Clean(p)
		add(filepath.Dir(p))
		if st, err := os.Stat(p); err == nil && st.IsDir() {
			add(p)
		}
		for _, link := range symlinksOnTheWay(p) {
			add(filepath.Dir(link))
		}
	}
	return out
}

// symlinksOnTheWay returns the symlinks met resolving p, in order: each
// a path whose directory holds the link. Bounded, as the kernel's own
// resolution is, against loops.
func symlinksOnTheWay(p string) []string {
	var links []string
	abs, err := filepath.Abs(p)
	if err != nil {
		return nil
	}
	todo := strings.Split(strings.TrimPrefix(abs, string(filepath.Separator)), string(filepath.Separator))
	cur := string(filepath.Separator)
	for hops := 0; len(todo) > 0 && hops < 40; {
		next := filepath.Join(cur, todo[0])
		todo = todo[1:]
		st, err := os.Lstat(next)
		if err != nil {
			return links
		}
		if st.Mode()&os.ModeSymlink == 0 {
			cur = next
			continue
		}
		hops++
		links = append(links, next)
		target, err := os.Readlink(next)
		if err != nil {
			return links
		}
		if !filepath.IsAbs(target) {
			target = filepath.Join(cur, target)
		}
		rest := strings.Split(strings.TrimPrefix(filepath.Clean(target), string(filepath.Separator)), string(filepath.Separator))
		todo = append(rest, todo...)
		cur = string(filepath.Separator)
	}
	return links
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
			w.Refresh()
			changed()
		}
	}
}
