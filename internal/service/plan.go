package service

import (
	"fmt"
	"strings"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/ratelimitd/ratelimitd/config"
	"github.com/ratelimitd/ratelimitd/internal/limit"
)

// item is the plan for one request descriptor.
type item struct {
	kind     itemKind
	rule     *config.Rule // nil for a request override
	rpu      uint64
	unit     config.Unit
	name     string
	windowUS int64
	algo     limit.Algorithm
	calendar limit.Calendar
	burst    uint64
	lease    bool
	global   bool
	mult     uint32
	hits     uint64
	refund   bool
	usage    bool            // a call on a rule that takes usage (rejected_hits: usage); ukind says which
	ukind    limit.UsageKind // set by classify
	stated   bool            // the hits were stated (a descriptor's or the request's hits_addend)
	pairID   string          // the request's id, from a request_id level (not part of the counter)
	shadow   bool
	quota    bool
	check    int    // index into the request's checks when kind == counted
	after    uint64 // the hits of the same counter's later items in the request (see buildChecks)
	override bool
	failure  config.FailureMode
	replaced bool
	label    string // the rule label of metrics: the limit's name, else the rule's path
}

type itemKind uint8

const (
	noLimit   itemKind = iota // no rule, a rule without a limit, or replaced
	unlimited                 // `unlimited: true`
	counted                   // decided on a counter
)

// validate checks the request against the size bounds before anything is
// matched or allocated for it.
func (s *Service) validate(req *rlsv3.RateLimitRequest) error {
	if req.GetDomain() == "" {
		return fmt.Errorf("%w: domain must not be empty", ErrInvalidRequest)
	}
	descs := req.GetDescriptors()
	if len(descs) == 0 {
		return fmt.Errorf("%w: descriptors must not be empty", ErrInvalidRequest)
	}
	if len(descs) > s.opts.MaxDescriptors {
		return fmt.Errorf("%w: %d descriptors, more than the %d allowed", ErrInvalidRequest, len(descs), s.opts.MaxDescriptors)
	}
	if n := len(req.GetDomain()); n > s.opts.MaxEntryBytes {
		return fmt.Errorf("%w: domain is %d bytes, more than the %d allowed", ErrInvalidRequest, n, s.opts.MaxEntryBytes)
	}
	for i, d := range descs {
		ents := d.GetEntries()
		if len(ents) == 0 {
			return fmt.Errorf("%w: descriptors[%d] has no entries", ErrInvalidRequest, i)
		}
		if len(ents) > s.opts.MaxEntries {
			return fmt.Errorf("%w: descriptors[%d]: %d entries, more than the %d allowed", ErrInvalidRequest, i, len(ents), s.opts.MaxEntries)
		}
		for j, e := range ents {
			if n := len(e.GetKey()); n > s.opts.MaxEntryBytes {
				return fmt.Errorf("%w: descriptors[%d].entries[%d].key is %d bytes, more than the %d allowed", ErrInvalidRequest, i, j, n, s.opts.MaxEntryBytes)
			}
			if n := len(e.GetValue()); n > s.opts.MaxEntryBytes {
				return fmt.Errorf("%w: descriptors[%d].entries[%d].value is %d bytes, more than the %d allowed", ErrInvalidRequest, i, j, n, s.opts.MaxEntryBytes)
			}
		}
		if h := d.GetHitsAddend(); h != nil && h.GetValue() > limit.MaxLimit {
			return fmt.Errorf("%w: descriptors[%d].hits_addend %d is more than %d, the most a counter holds", ErrInvalidRequest, i, h.GetValue(), uint64(limit.MaxLimit))
		}
		if ov := d.GetLimit(); ov != nil && config.Unit(ov.GetUnit()).Duration() == 0 {
			return fmt.Errorf("%w: descriptors[%d].limit.unit %v is not a unit", ErrInvalidRequest, i, ov.GetUnit())
		}
	}
	return nil
}

// plan matches every descriptor and fills items; replaced limits end as
// noLimit. dom may be nil (unknown domain: nothing is limited, overrides
// included, as envoyproxy/ratelimit does).
func (s *Service) plan(req *rlsv3.RateLimitRequest, dom *config.Domain, items []item) {
	defaultHits := uint64(req.GetHitsAddend())
	stated := defaultHits > 0
	if defaultHits == 0 {
		defaultHits = 1
	}
	var replaced map[string]struct{}
	for i, d := range req.GetDescriptors() {
		it := &items[i]
		*it = item{hits: defaultHits, refund: d.GetIsNegativeHits(), stated: stated}
		if h := d.GetHitsAddend(); h != nil {
			it.hits, it.stated = h.GetValue(), true
		}
		// Any call on a rule that takes usage may be part of a budget:
		// classify says which (a refund never is).
		it.usage = !it.refund
		switch {
		case dom == nil:
		case d.GetLimit() != nil:
			s.planOverride(it, d.GetLimit())
		default:
			r := dom.Match(d.GetEntries())
			if r == nil || r.Limit == nil {
				continue
			}
			for _, name := range r.Limit.Replaces {
				if replaced == nil {
					replaced = make(map[string]struct{}, len(r.Limit.Replaces))
				}
				replaced[name] = struct{}{}
			}
			s.planRule(it, dom, r, d.GetEntries())
		}
	}
	s.classify(items)
	for i := range items {
		if _, ok := replaced[items[i].name]; ok && items[i].name != "" {
			items[i].kind, items[i].replaced = noLimit, true
		}
	}
}

// planOverride fills the item of a descriptor carrying its own limit. An
// override is counted on the descriptor's own entries; its value is not
// part of the key, so overrides cannot grow the key space, and it is
// never shadowed, replaced or named.
func (s *Service) planOverride(it *item, ov *rlcommon.RateLimitDescriptor_RateLimitOverride) {
	it.kind, it.override, it.label = counted, true, "override"
	it.rpu, it.unit = uint64(ov.GetRequestsPerUnit()), config.Unit(ov.GetUnit())
	it.windowUS = int64(it.unit.Duration() / 1000)
	it.usage = it.usage && s.opts.RejectedHits == config.RejectedUsage
}

// planRule fills the item of a descriptor that matched rule r, which has
// a rate_limit.
func (s *Service) planRule(it *item, dom *config.Domain, r *config.Rule, ents []*rlcommon.RateLimitDescriptor_Entry) {
	l := r.Limit
	it.rule, it.name, it.label = r, l.Name, l.Name
	switch {
	case r.DetailedMetric:
		it.label = s.detailed.label(dom.Name, r, ents)
	case it.label == "":
		it.label = r.Path
	}
	it.shadow, it.quota, it.failure = r.ShadowMode, r.QuotaMode, r.FailureMode
	if l.Unlimited {
		it.kind = unlimited
		return
	}
	it.kind = counted
	it.rpu, it.unit = l.RequestsPerUnit, l.Unit
	it.windowUS = l.Window().Microseconds()
	if l.Calendar || !l.CalendarSet && s.opts.CalendarPeriods && l.CalendarEligible() && dom.RLQSKeys == nil {
		it.calendar, it.windowUS = limit.CalendarMonth, limit.CalendarMonthUS
		if l.Unit == config.UnitYear {
			it.calendar, it.windowUS = limit.CalendarYear, limit.CalendarYearUS
		}
	}
	it.algo, it.burst, it.mult, it.lease = limit.Algorithm(l.Algorithm), uint64(l.Burst), l.UnitMultiplier, l.Lease
	rejected := l.RejectedHits
	if rejected == config.RejectedUnset {
		rejected = s.opts.RejectedHits
	}
	it.usage = it.usage && rejected == config.RejectedUsage
	// A lease spends hits taken before they are used; a call stating its
	// hits is decided in the store, where it is recorded. A request
	// stating none keeps its lease and stays plain.
	if it.lease && it.stated {
		it.lease = false
	}
	it.usage = it.usage && !it.lease
	// A global limit is spent from grants drawn ahead; on a usage rule,
	// charges come out of them and what they do not cover is settled at
	// the home (internal/global).
	it.global = l.Global
	if r.RequestID {
		it.pairID = ents[len(ents)-1].GetValue()
	}
}

// counterKey encodes the counter of a counted item. With share_threshold,
// the level's wildcard pattern stands for the request's value, so every
// matching value shares one counter.
func (s *Service) counterKey(enc *limit.Encoder, domain string, ents []*rlcommon.RateLimitDescriptor_Entry, it *item) string {
	enc.Reset(s.opts.KeyPrefix, domain)
	levels := sharedLevels(it, len(ents))
	for j, e := range idEntriesOut(it, ents) {
		if p, ok := sharedPattern(levels, j); ok {
			enc.SharedEntry(e.GetKey(), p)
			continue
		}
		enc.Entry(e.GetKey(), e.GetValue())
	}
	return enc.KeyFor(it.algo, it.windowUS)
}

// incumbentKey is envoyproxy/ratelimit's key of a counted item without its
// window start: <prefix><domain>_<k1>_<v1>_..._ (docs/migrating.md,
// "Switching without losing counts"), share_threshold's wildcard pattern
// standing for the value, as the incumbent writes it.
func (s *Service) incumbentKey(domain string, ents []*rlcommon.RateLimitDescriptor_Entry, it *item) string {
	levels := sharedLevels(it, len(ents))
	ents = idEntriesOut(it, ents)
	var b strings.Builder
	b.WriteString(s.opts.KeyPrefix)
	b.WriteString(domain)
	b.WriteByte('_')
	for j, e := range ents {
		v := e.GetValue()
		if p, ok := sharedPattern(levels, j); ok {
			v = p
		}
		b.WriteString(e.GetKey())
		b.WriteByte('_')
		b.WriteString(v)
		b.WriteByte('_')
	}
	return b.String()
}

// idEntriesOut returns a counted item's entries without its request's
// id (a request_id level's, the last): every request shares the counter.
func idEntriesOut(it *item, ents []*rlcommon.RateLimitDescriptor_Entry) []*rlcommon.RateLimitDescriptor_Entry {
	if it.rule != nil && it.rule.RequestID {
		return ents[:len(ents)-1]
	}
	return ents
}

// sharedLevels returns the matched rule's levels for n entries when one
// of them has share_threshold, else nil.
func sharedLevels(it *item, n int) []*config.Rule {
	for r := it.rule; r != nil; r = r.Parent() {
		if r.ShareThreshold {
			return it.rule.Levels(n)
		}
	}
	return nil
}

// sharedPattern returns the wildcard pattern that stands for entry j's
// value (share_threshold: every matching value shares one counter), if
// any.
func sharedPattern(levels []*config.Rule, j int) (string, bool) {
	if levels != nil && levels[j] != nil && levels[j].ShareThreshold {
		return levels[j].Value, true
	}
	return "", false
}

// classify tells each usage call of a request what it is, from what
// Envoy sends (docs/token-budgets.md, "What each call does"): a request
// in which some usage descriptor states 2 hits or more is a stream end,
// whose descriptors stating hits are charges (0 a zero charge: a token
// kind the stream did not use); at the request phase a descriptor
// stating 0 is a budget check (or a read: the store tells, from the
// counter), and one stating 1 or none (AI Gateway's QuotaPolicy, Envoy
// Gateway's cost.request 1) a request that costs 1, which the store
// makes a budget check only on a counter that is a budget. So a stated 1
// and no hits are the same call everywhere. Under NoBudgets, only a
// stream end's stated hits are usage: charges that teach nothing.
func (s *Service) classify(items []item) {
	end := streamEnd(items)
	for i := range items {
		it := &items[i]
		if it.kind != counted || !it.usage {
			continue
		}
		switch {
		case s.opts.NoBudgets && end && it.stated && it.hits > 0:
			it.ukind = limit.PlainCharge
		case s.opts.NoBudgets:
			it.usage = false
		case !it.stated || !end && it.hits == 1:
			it.ukind = limit.CostCheck
		case end && it.hits == 0:
			it.ukind = limit.ZeroCharge
		default:
			it.ukind = limit.ByHits
		}
	}
}

// streamEnd reports a request in which some usage descriptor states 2
// hits or more.
func streamEnd(items []item) bool {
	for i := range items {
		if it := &items[i]; it.kind == counted && it.usage && it.stated && it.hits >= 2 {
			return true
		}
	}
	return false
}
