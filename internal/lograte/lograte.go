// Package lograte bounds how often a recurring failure is logged: a
// failure that repeats on every request or every flush must not flood the
// log, while the metric beside it counts every one.
package lograte

import (
	"sync"
	"sync/atomic"
	"time"
)

// Limiter lets one line through per interval. The zero value lets the
// first line through; it is safe for concurrent use.
type Limiter struct {
	last atomic.Int64 // unix ns of the last line let through
}

// Allow reports whether a line may be logged at now, at most one every
// interval; of calls racing for the same turn, one wins.
func (l *Limiter) Allow(now time.Time, interval time.Duration) bool {
	n := now.UnixNano()
	prev := l.last.Load()
	if prev != 0 && n-prev < int64(interval) {
		return false
	}
	return l.last.CompareAndSwap(prev, n)
}

// Keyed is a Limiter per key (a sink, say). The zero value is usable.
type Keyed struct {
	m sync.Map // key → *Limiter
}

// Allow is Limiter.Allow for key.
func (k *Keyed) Allow(key string, now time.Time, interval time.Duration) bool {
	v, _ := k.m.LoadOrStore(key, new(Limiter))
	return v.(*Limiter).Allow(now, interval)
}
