package incumbentstats

import (
	"sync/atomic"

	"github.com/ratelimitd/ratelimitd/config"
	"github.com/ratelimitd/ratelimitd/internal/record"
)

// Recorder is the record.Recorder of envoyproxy/ratelimit's stats: it
// counts each decision under the rules in force (record.RulesUser), as
// the incumbent names them; a refund counts nothing there, as in the
// incumbent.
type Recorder struct {
	s     *Stats
	rules atomic.Pointer[Rules]
}

// NewRecorder records into s (nil: counts nothing).
func NewRecorder(s *Stats) *Recorder { return &Recorder{s: s} }

// UseRules makes the counters of snap's rules, for the requests that
// follow.
func (r *Recorder) UseRules(snap *config.Snapshot) { r.rules.Store(r.s.ForRules(snap)) }

// Record counts a descriptor's decision.
func (r *Recorder) Record(d record.Decision) {
	rules := r.rules.Load()
	if rules == nil || !d.Counted || d.Refund {
		return
	}
	stats := rules.For(d.Domain, d.Rule, d.Entries)
	stats.Total(d.Hits)
	switch {
	case d.Cached:
		stats.LocalCache(d.Hits)
	case d.Stored:
		stats.Decided(d.Hits, d.Limit, d.Before, d.Over)
	}
	if d.Shadow {
		stats.Shadow(d.Hits)
	}
}

// Event counts a request-level event.
func (r *Recorder) Event(e record.Event) {
	switch e.Kind {
	case record.Request:
		r.s.Request(e.Duration)
	case record.Invalid, record.NoRules:
		r.s.ServiceError()
	case record.UnknownDomain:
		r.s.DomainNotFound(e.Domain)
	case record.StoreError:
		r.s.RedisError()
	case record.GlobalShadow:
		r.s.GlobalShadow()
	}
}
