package rlqs

import (
	"time"
)

// counter is what the server knows of one counter its buckets draw on.
type counter struct {
	subs      int       // buckets of all streams on it
	rateSum   float64   // their measured demand, requests per second
	remaining uint64    // after the last grant
	validTill time.Time // remaining is of a window that ends then
	// The demand of ShouldRateLimit's callers on it here, hits per
	// second (rlsRate < 0 until measured), from Demand's count.
	rlsRate  float64
	rlsHits  uint64
	rlsSince time.Time
}

// measureRLSLocked updates c's RLS demand from its count at now, as a
// bucket's demand is measured: over a second at least, averaged with the
// rate before.
func (s *Server) measureRLSLocked(key string, c *counter, now time.Time) {
	el := now.Sub(c.rlsSince)
	if el < time.Second {
		return
	}
	n := s.plan.Demand().Hits(key)
	r := float64(n-c.rlsHits) / el.Seconds()
	if c.rlsRate < 0 {
		c.rlsRate = r
	} else {
		c.rlsRate = (c.rlsRate + r) / 2
	}
	c.rlsHits, c.rlsSince = n, now
}

func (s *Server) unsubscribeLocked(b *bucket) {
	if b.subscribed == "" {
		return
	}
	if c := s.counters[b.subscribed]; c != nil {
		c.rateSum -= b.contrib
		if c.subs--; c.subs <= 0 {
			delete(s.counters, b.subscribed)
			s.plan.Demand().Unwatch(b.subscribed)
		}
	}
	b.subscribed, b.contrib = "", 0
}

// noteRate puts the bucket's demand into its counter's sum.
func (s *Server) noteRate(b *bucket) {
	s.mu.Lock()
	if c := s.counters[b.subscribed]; c != nil {
		contributeLocked(c, b)
	}
	s.mu.Unlock()
}

// contributeLocked makes the bucket's measured rate its part of c's sum
// (nothing while unmeasured).
func contributeLocked(c *counter, b *bucket) {
	if b.rate >= 0 {
		c.rateSum += b.rate - b.contrib
		b.contrib = b.rate
	}
}

func (s *Server) noteRemaining(key string, remaining uint64, till time.Time) {
	s.mu.Lock()
	if c := s.counters[key]; c != nil {
		c.remaining, c.validTill = remaining, till
	}
	s.mu.Unlock()
}
