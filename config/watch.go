package config

import (
	"context"
	"fmt"
	"time"

	"github.com/ratelimitd/ratelimitd/internal/filewatch"
)

// DefaultDebounce is how long Watch waits after the last file event before
// loading, so that an editor's or kubelet's burst of writes, renames and
// symlink swaps gives one reload: filewatch's. Watch does not use
// filewatch.Watch's debounce itself because it also needs each event as it
// comes, to cancel a load in progress that the event makes stale.
const DefaultDebounce = filewatch.DefaultDebounce

// Watch loads the rules at paths, read with opts, whenever something
// changes there, until ctx is done, and calls onLoad with each new
// snapshot — or with the error
// when the rules became invalid (the caller keeps the rules in force).
// A load whose files hash like the last good one is not reported. It
// watches each path and its parent directory, non-recursively, which
// catches in-place writes, editors that write a temporary file and rename
// it, a symlink to a directory being swapped (ln -sfn), and Kubernetes
// ConfigMap updates (the "..data" symlink swap inside the mounted
// directory), and a swap of any symlink on the way to a path (the
// incumbent's RUNTIME_ROOT "current" link), after which the directories
// the link now leads to are watched. It returns an error only when it
// cannot start watching.
func Watch(ctx context.Context, paths []string, opts Options, debounce time.Duration, lastHash string, onLoad func(*Snapshot, error)) error {
	if debounce <= 0 {
		debounce = DefaultDebounce
	}
	w, err := filewatch.New(paths)
	if err != nil {
		return fmt.Errorf("config: %w", err)
	}
	defer w.Close()
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	defer timer.Stop()

	// A load runs off this loop, so that events keep coming in while a
	// slow file is parsed: a newer change cancels the load in progress,
	// whose result is then dropped, and is loaded once that one has
	// unwound.
	type result struct {
		snap *Snapshot
		err  error
	}
	results := make(chan result, 1) // one load at a time: its send never blocks
	// failed: the last load failed, so the next that succeeds is told
	// even when it holds the rules in force (a fix that reverts a bad
	// edit), and the failure's report does not stay the last word.
	var loading, stale, due, failed bool
	cancel := context.CancelFunc(func() {})
	defer func() {
		cancel()
		if loading {
			<-results
		}
	}()
	startLoad := func() {
		var lctx context.Context
		lctx, cancel = context.WithCancel(ctx)
		loading, stale, due = true, false, false
		go func() {
			snap, err := LoadWith(lctx, opts, paths...)
			results <- result{snap, err}
		}()
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case _, ok := <-w.Events:
			if !ok {
				return nil
			}
			if loading {
				cancel()
				stale = true
			}
			timer.Reset(debounce)
		case err, ok := <-w.Errors:
			if !ok {
				return nil
			}
			onLoad(nil, fmt.Errorf("config: watch: %w", err))
		case <-timer.C:
			w.Refresh()
			if loading {
				due = true
				continue
			}
			startLoad()
		case r := <-results:
			loading = false
			cancel()
			switch {
			case stale:
			case r.err != nil:
				failed = true
				onLoad(nil, r.err)
			case r.snap.Hash != lastHash || failed:
				lastHash, failed = r.snap.Hash, false
				onLoad(r.snap, nil)
			}
			if due {
				startLoad()
			}
		}
	}
}
