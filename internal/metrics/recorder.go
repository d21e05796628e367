package metrics

import "github.com/ratelimitd/ratelimitd/internal/record"

// Recorder is the record.Recorder of ratelimitd's own metrics.
type Recorder struct{ M *Metrics }

// Record counts a descriptor's decision and its hits.
func (r Recorder) Record(d record.Decision) {
	if d.Counted && !d.Refund {
		r.M.Hit(d.Domain, d.Label, d.HitsResult, d.Hits)
	}
	r.M.Decision(d.Domain, d.Label, d.Outcome)
}

// Event counts a request-level event.
func (r Recorder) Event(e record.Event) {
	switch e.Kind {
	case record.Request:
		r.M.Request(e.Code, e.Duration)
	case record.Invalid:
		r.M.InvalidRequest()
	case record.UnknownDomain:
		r.M.UnknownDomainRequest()
	case record.Canceled:
		r.M.CanceledRequest()
	case record.GlobalShadow:
		r.M.ShadowRequest()
	case record.Hits:
		r.M.Hit(e.Domain, e.Label, e.HitsResult, e.Hits)
	}
}
