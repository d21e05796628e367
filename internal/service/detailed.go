package service

import (
	"strings"
	"sync"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"

	"github.com/ratelimitd/ratelimitd/config"
)

// DefaultDetailedMetricCap bounds the distinct values a detailed_metric
// rule may add to metrics.
const DefaultDetailedMetricCap = 100

// detailedLabels hands out metric labels carrying request values for
// detailed_metric rules, at most cap per rule; later values share the
// label "<rule path>.<overflow>", so a client cycling values cannot grow
// the metrics without bound (the incumbent's open issue #275).
type detailedLabels struct {
	cap int
	mu  sync.Mutex
	// seen is per rule, keyed by the rule pointer: a rules reload starts
	// afresh with new rules.
	seen map[*config.Rule]map[string]struct{}
}

// label returns the detailed label for entries matched by r.
func (d *detailedLabels) label(domain string, r *config.Rule, ents []*rlcommon.RateLimitDescriptor_Entry) string {
	var b strings.Builder
	b.WriteString(domain)
	for _, e := range ents {
		b.WriteByte('.')
		b.WriteString(e.GetKey())
		b.WriteByte('_')
		b.WriteString(e.GetValue())
	}
	l := b.String()
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.seen == nil {
		d.seen = map[*config.Rule]map[string]struct{}{}
	}
	vals := d.seen[r]
	if vals == nil {
		vals = map[string]struct{}{}
		d.seen[r] = vals
	}
	if _, ok := vals[l]; ok {
		return l
	}
	if len(vals) >= d.cap {
		return r.Path + ".<overflow>"
	}
	vals[l] = struct{}{}
	return l
}

// reset forgets every rule's values, on a rules change.
func (d *detailedLabels) reset() {
	d.mu.Lock()
	d.seen = nil
	d.mu.Unlock()
}
