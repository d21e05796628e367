package redisstore

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"
)

// TestBreakerIgnoresStaleRoundTrips: a round trip that began before Redis
// last answered waited behind a stall that is over, and does not count.
func TestBreakerIgnoresStaleRoundTrips(t *testing.T) {
	b := downBreaker(t)
	began := time.Now().Add(-time.Millisecond)
	b.success()
	b.roundTrip(began, began.Add(time.Second), context.DeadlineExceeded)
	if b.isOpen() {
		t.Fatal("a round trip that began before Redis answered opened the breaker")
	}
	now := time.Now()
	b.roundTrip(now, now.Add(time.Second), context.DeadlineExceeded)
	if !b.isOpen() {
		t.Fatal("a failed round trip that began after Redis answered did not count")
	}
}

// TestOpenBreakerProbesBackToBack: while open, a probe is always in
// flight (a failed one is followed by the next within probeGap, not
// after the probe interval), so a Redis that answers again closes the
// breaker at once.
func TestOpenBreakerProbesBackToBack(t *testing.T) {
	var probes atomic.Int64
	probe := func(context.Context) error {
		if probes.Add(1) < 3 {
			return errors.New("down")
		}
		return nil
	}
	b := newBreaker(1, time.Nanosecond, time.Hour, probe, func(bool) {})
	defer b.stop()
	now := time.Now()
	b.roundTrip(now, now.Add(time.Second), context.DeadlineExceeded)
	deadline := time.Now().Add(2 * time.Second)
	for b.isOpen() {
		if time.Now().After(deadline) {
			t.Fatalf("still open 2 s later after %d probes (the probe interval is an hour)", probes.Load())
		}
		time.Sleep(time.Millisecond)
	}
}

// TestCanceledRoundTripsKeepBreakerClosed: round trips their callers
// canceled say nothing about Redis: however many, for however long, they
// never open the breaker; the same round trips timing out do.
func TestCanceledRoundTripsKeepBreakerClosed(t *testing.T) {
	b := downBreaker(t)
	for range 10 {
		now := time.Now()
		b.roundTrip(now, now.Add(time.Second), fmt.Errorf("eval: %w", context.Canceled))
		time.Sleep(time.Millisecond)
	}
	if b.isOpen() {
		t.Fatal("canceled round trips opened the breaker")
	}
	now := time.Now()
	b.roundTrip(now, now.Add(time.Second), context.DeadlineExceeded)
	if !b.isOpen() {
		t.Fatal("a round trip that timed out did not count")
	}
}

// TestBreakerTrialsPaced: while the breaker is open, a real call goes to
// Redis as a trial at most once per trialEvery (the first one trialEvery
// after it opened), and never while a trial is in flight.
func TestBreakerTrialsPaced(t *testing.T) {
	b := downBreaker(t)
	now := time.Now()
	b.roundTrip(now, now.Add(time.Second), context.DeadlineExceeded)
	if !b.isOpen() {
		t.Fatal("the breaker did not open")
	}
	if ok, _ := b.allow(); ok {
		t.Fatalf("a call let through at once after opening, within trialEvery (%v)", b.trialEvery)
	}
	every := b.trialEvery
	b.trialEvery = 0 // as if trialEvery had passed
	if ok, trial := b.allow(); !ok || !trial {
		t.Fatalf("after trialEvery: ok %v trial %v, want a trial", ok, trial)
	}
	if ok, _ := b.allow(); ok {
		t.Error("a second call let through while the trial is in flight")
	}
	b.trialDone()
	b.trialEvery = every
	if ok, _ := b.allow(); ok {
		t.Error("a call let through right after a trial, within trialEvery")
	}
}

// downBreaker is a breaker that opens on the first failed round trip,
// whose probe always fails; it stops at the test's end.
func downBreaker(t *testing.T) *breaker {
	b := newBreaker(1, time.Nanosecond, time.Hour, func(context.Context) error { return errors.New("down") }, func(bool) {})
	t.Cleanup(b.stop)
	return b
}
