package global

import (
	"time"

	"github.com/ratelimitd/ratelimitd/internal/lease"
	"github.com/ratelimitd/ratelimitd/internal/limit"
)

// entry returns c's counter's entry, made on first use; nil when the
// store holds too many. Called with mu held.
func (s *Store) entry(c *limit.Check, now time.Time) *entry {
	e := s.entries[c.Key]
	if e == nil {
		if len(s.entries) >= maxEntries && !s.evict(now) {
			return nil
		}
		e = &entry{check: *c, Meter: lease.Meter{From: now}, remaining: c.Limit}
		e.check.Hits, e.check.Refund, e.check.Global = 0, false, false
		s.entries[c.Key] = e
		s.kick()
	}
	e.lastUse = now
	return e
}

// evictSample is how many counters a store full (maxEntries) looks at
// for one to forget, and evictAfter how long that one must have gone
// unasked.
const (
	evictSample = 16
	evictAfter  = time.Second
)

// quiet reports that e has nothing under way, waiting, in flight or
// owed: forgetting it loses no call, request, stream or charge. Called
// with mu held.
func (e *entry) quiet() bool {
	return e.inFlight == 0 && e.waiting == 0 && len(e.flights) == 0 && e.owed() == 0
}

// evict forgets a counter to make room for a new one, when one of a few
// taken at random went unasked for evictAfter and has nothing under way,
// owed or in flight; the hits it holds are dropped (counted lost: they
// stay counted at the home, never over the limit). It reports whether it
// made room. Called with mu held.
func (s *Store) evict(now time.Time) bool {
	n := 0
	for k, e := range s.entries {
		if n++; n > evictSample {
			return false
		}
		if e.quiet() && !e.queued && now.Sub(e.lastUse) > evictAfter {
			s.m.hits("lost", e.avail)
			delete(s.entries, k)
			return true
		}
	}
	return false
}
