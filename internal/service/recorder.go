package service

import (
	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"

	"github.com/ratelimitd/ratelimitd/config"
	"github.com/ratelimitd/ratelimitd/internal/metrics"
)

// Decision is what one descriptor's decision reports, once, to every
// Recorder: a descriptor decided against a counter (Counted), or an
// unlimited one.
type Decision struct {
	Domain, Label string
	Rule          *config.Rule
	Entries       []*rlcommon.RateLimitDescriptor_Entry
	Hits          uint64
	// Counted: decided against a counter; false for an unlimited rule.
	Counted bool
	// Refund: the descriptor gave hits back (is_negative_hits).
	Refund bool
	// HitsResult is ratelimitd_hits_total's result for the hits: what
	// became of them in the store (empty for a refund).
	HitsResult string
	// Outcome is the decision's reason (Outcome* constants).
	Outcome string
	// Cached: answered by the local cache. Stored: decided by the store,
	// with the counter's Limit, its use Before these hits, and whether
	// they were Over (before shadow mode made the answer OK).
	Cached, Stored bool
	Limit, Before  uint64
	Over           bool
}

// Recorder is told each descriptor's decision once: the service's
// Prometheus metrics and envoyproxy/ratelimit's stats are two.
type Recorder interface {
	Record(d Decision)
}

// record tells every recorder of d.
func (s *Service) record(d Decision) {
	for _, r := range s.recorders {
		r.Record(d)
	}
}

// metricsRecorder counts decisions and hits in ratelimitd's metrics.
type metricsRecorder struct{ m *metrics.Metrics }

func (mr metricsRecorder) Record(d Decision) {
	if d.Counted && !d.Refund {
		mr.m.Hit(d.Domain, d.Label, d.HitsResult, d.Hits)
	}
	mr.m.Decision(d.Domain, d.Label, d.Outcome)
}

// compatRecorder counts decisions in envoyproxy/ratelimit's stats, under
// the rules in force (a refund counts nothing there, as in the
// incumbent).
type compatRecorder struct{ s *Service }

func (cr compatRecorder) Record(d Decision) {
	rules := cr.s.compatRules.Load()
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
	if d.Outcome == OutcomeShadow {
		stats.Shadow(d.Hits)
	}
}
