package redisstore

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"
)

// breaker stops the store from waiting on a Redis that does not answer.
// It judges Redis by its round trips (script calls), not by the requests
// they carry: with batching one slow round trip fails every request in
// it, and counting those opened the breaker on a single hiccup. It opens
// only when round trips have kept failing (timeouts, connection errors)
// for openAfter, at least minFails of them, with no success in between. A
// round trip that began before Redis last answered does not count: it
// waited behind a stall that is over.
//
// While open, calls fail at once, and the first round trip Redis answers
// closes it. A probe is kept in flight all the while (back to back, each
// bounded by the probe interval), so that a Redis that resumes after a
// stall answers it at once and decisions are right again within
// milliseconds; real traffic is let through too, one call at a time and
// at most one per trialEvery, so that the script path itself is tried.
// Each such call may wait for the timeout: the rate keeps them rare.
type breaker struct {
	minFails   int
	openAfter  time.Duration
	trialEvery time.Duration
	interval   time.Duration
	probe      func(ctx context.Context) error
	onChange   func(open bool)

	open        atomic.Bool
	lastSuccess atomic.Int64 // when the latest answered round trip ended, Unix ns
	lastTrial   atomic.Int64 // when the latest trial call was let through, Unix ns
	trial       atomic.Bool  // a trial call is in flight
	failing     atomic.Bool  // failures recorded since the last success

	mu        sync.Mutex // guards what follows, and orders opening, closing and stop
	failSince time.Time  // start of the first failed round trip since the last success
	fails     int
	done      chan struct{} // closed by stop; ends the probe
	probing   bool
	wg        sync.WaitGroup
}

// trialEvery spaces the real calls let through while the breaker is
// open; probeGap is the least time between the starts of two probes, so
// that a refused connection does not turn the probe into a busy loop.
const (
	trialEvery = time.Second
	probeGap   = 5 * time.Millisecond
)

func newBreaker(minFails int, openAfter, interval time.Duration, probe func(context.Context) error, onChange func(bool)) *breaker {
	return &breaker{minFails: minFails, openAfter: openAfter, trialEvery: trialEvery, interval: interval,
		probe: probe, onChange: onChange, done: make(chan struct{})}
}

// isOpen reports whether the breaker is open.
func (b *breaker) isOpen() bool { return b.open.Load() }

// allow reports whether a call may go to Redis: always while closed;
// while open, as the one trial in flight, at most one per trialEvery. A
// trial reports trial true and must call trialDone when it ends.
func (b *breaker) allow() (ok, trial bool) {
	if !b.open.Load() {
		return true, false
	}
	now := time.Now().UnixNano()
	if now-b.lastTrial.Load() < int64(b.trialEvery) || !b.trial.CompareAndSwap(false, true) {
		return false, false
	}
	b.lastTrial.Store(now)
	return true, true
}

// trialDone ends a trial call.
func (b *breaker) trialDone() { b.trial.Store(false) }

// roundTrip records the outcome of one round trip that started at start
// with a deadline. Error replies (NOREPLICAS, OOM, ...) are Redis
// answering; a round trip given almost no time, or abandoned by its
// callers, says nothing about Redis.
func (b *breaker) roundTrip(start, deadline time.Time, err error) {
	class := Classify(err)
	switch {
	case !tripsBreaker(class):
		b.success()
	case errors.Is(err, context.Canceled) || deadline.Sub(start) < minBudget:
	default:
		b.failure(start)
	}
}

// success records an answered round trip and closes the breaker. A
// healthy round trip costs an atomic store and two loads.
func (b *breaker) success() {
	b.lastSuccess.Store(time.Now().UnixNano())
	if !b.failing.Load() && !b.open.Load() {
		return
	}
	b.mu.Lock()
	b.fails, b.failSince = 0, time.Time{}
	b.failing.Store(false)
	wasOpen := b.open.Swap(false)
	b.mu.Unlock()
	if wasOpen {
		b.onChange(false)
	}
}

// failure records a failed round trip and opens the breaker once round
// trips have failed for openAfter, at least minFails of them.
func (b *breaker) failure(start time.Time) {
	if start.UnixNano() < b.lastSuccess.Load() {
		return // Redis answered since this round trip began
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.fails == 0 || start.Before(b.failSince) {
		b.failSince = start
	}
	b.fails++
	b.failing.Store(true)
	if b.open.Load() || b.fails < b.minFails || time.Since(b.failSince) < b.openAfter {
		return
	}
	select {
	case <-b.done:
		return // stopped: no new probe
	default:
	}
	b.open.Store(true)
	b.lastTrial.Store(time.Now().UnixNano())
	b.onChange(true)
	if !b.probing {
		b.probing = true
		b.wg.Go(b.probeLoop)
	}
}

// probeLoop keeps a probe in flight while the breaker is open, until it
// is stopped.
func (b *breaker) probeLoop() {
	for {
		if !b.open.Load() {
			b.mu.Lock()
			if !b.open.Load() {
				b.probing = false
				b.mu.Unlock()
				return
			}
			b.mu.Unlock()
		}
		start := time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), b.interval)
		err := b.probe(ctx)
		cancel()
		if err == nil {
			b.success()
			continue
		}
		select {
		case <-b.done:
			return
		case <-time.After(probeGap - time.Since(start)):
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
