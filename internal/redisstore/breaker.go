package redisstore

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// breaker stops the store from waiting on a Redis that does not answer:
// after threshold consecutive timeouts or connection errors it opens, every
// call fails at once, and a background probe closes it as soon as Redis
// answers again.
type breaker struct {
	threshold int
	interval  time.Duration
	probe     func(ctx context.Context) error
	onChange  func(open bool)

	open  atomic.Bool
	fails atomic.Int64  // consecutive timeouts and connection errors
	mu    sync.Mutex    // orders opening, closing and stop
	done  chan struct{} // closed by stop; ends the probe
	wg    sync.WaitGroup
}

func newBreaker(threshold int, interval time.Duration, probe func(context.Context) error, onChange func(bool)) *breaker {
	return &breaker{threshold: threshold, interval: interval, probe: probe, onChange: onChange, done: make(chan struct{})}
}

// isOpen reports whether calls should fail at once.
func (b *breaker) isOpen() bool { return b.open.Load() }

// record counts one call's outcome.
// A success costs one atomic load: it is every healthy call.
func (b *breaker) record(class string) {
	if !tripsBreaker(class) {
		if class == "" && b.fails.Load() != 0 {
			b.fails.Store(0)
		}
		return
	}
	if b.fails.Add(1) < int64(b.threshold) || b.open.Load() {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.open.Load() {
		return
	}
	select {
	case <-b.done:
		return // stopped: no new probe
	default:
	}
	b.open.Store(true)
	b.onChange(true)
	b.wg.Go(b.probeLoop)
}

// probeLoop probes until Redis answers or the breaker is stopped.
func (b *breaker) probeLoop() {
	t := time.NewTicker(b.interval)
	defer t.Stop()
	for {
		select {
		case <-b.done:
			return
		case <-t.C:
		}
		ctx, cancel := context.WithTimeout(context.Background(), b.interval)
		err := b.probe(ctx)
		cancel()
		if err == nil {
			b.mu.Lock()
			b.fails.Store(0)
			b.open.Store(false)
			b.mu.Unlock()
			b.onChange(false)
			return
		}
	}
}

// stop ends the probe, if any, and waits for it.
func (b *breaker) stop() {
	b.mu.Lock()
	select {
	case <-b.done:
	default:
		close(b.done)
	}
	b.mu.Unlock()
	b.wg.Wait()
}
