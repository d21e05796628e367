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
	// rls is the demand of ShouldRateLimit's callers on it here, hits
	// per second, from Demand's count (rlsHits when last read).
	rls     meter
	rlsHits uint64
}

// meter measures a rate: counts add up until a second or more has passed
// (counts closer than that say little of a rate), then make a rate
// averaged with the one before, the first taken as it is.
type meter struct {
	rate    float64 // per second; < 0 until measured
	pending uint64
	since   time.Time
}

func newMeter(now time.Time) meter { return meter{rate: -1, since: now} }

func (m *meter) add(now time.Time, n uint64) {
	m.pending += n
	if el := now.Sub(m.since); el >= time.Second {
		r := float64(m.pending) / el.Seconds()
		if m.rate < 0 {
			m.rate = r
		} else {
			m.rate = (m.rate + r) / 2
		}
		m.pending, m.since = 0, now
	}
}

// measureRLSLocked takes c's RLS callers' hits since it last looked into
// their rate.
func (s *Server) measureRLSLocked(key string, c *counter, now time.Time) {
	n := s.plan.Demand().Hits(key)
	c.rls.add(now, n-c.rlsHits)
	c.rlsHits = n
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
