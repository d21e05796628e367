package service

import (
	"math"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/ratelimitd/ratelimitd/internal/limit"
	"github.com/ratelimitd/ratelimitd/internal/record"
)

// respond builds the response from the decided items and counts each
// decision.
func (s *Service) respond(req *rlsv3.RateLimitRequest, descs []*rlcommon.RateLimitDescriptor, items []item, checks []limit.Check, states []checkState) *rlsv3.RateLimitResponse {
	r := responder{s: s, domain: req.GetDomain(), now: s.now(), descs: descs, items: items,
		checks: checks, states: states, stored: storeAdmitted(checks, states), why: newExplanation(s.opts.DecisionMetadata, items)}
	resp, statuses, slab := newResponse(len(items))
	overLimit, quotaTotal, quotaOver := false, 0, 0
	for i := range items {
		statuses[i] = &slab[i].st
		counted, over := r.status(i, &slab[i])
		if counted && items[i].quota {
			quotaTotal++
		}
		switch {
		case !over:
		case items[i].quota:
			quotaOver++
		default:
			overLimit = true
		}
	}
	resp.OverallCode = rlsv3.RateLimitResponse_OK
	if overLimit || (quotaTotal > 0 && quotaOver == quotaTotal) {
		resp.OverallCode = rlsv3.RateLimitResponse_OVER_LIMIT
		if s.opts.ShadowMode {
			resp.OverallCode = rlsv3.RateLimitResponse_OK
			s.event(record.Event{Kind: record.GlobalShadow})
		}
	}
	if s.opts.ResponseHeaders != HeadersOff {
		resp.ResponseHeadersToAdd = headers(s.opts.ResponseHeaders, s.opts.HeaderNames, items, statuses, states)
	}
	resp.DynamicMetadata = s.dynamicMetadata(req, items, statuses, r.why)
	return resp
}

// responder is what respond knows of one request while it builds each
// descriptor's status.
type responder struct {
	s      *Service
	domain string
	now    time.Time
	descs  []*rlcommon.RateLimitDescriptor
	items  []item
	checks []limit.Check
	states []checkState
	stored bool
	why    explanation
}

// status fills item i's status and counts its decision: counted reports
// a descriptor decided against a counter (not one without a rule or
// unlimited), over that it refuses the request (shadow mode taken).
func (r *responder) status(i int, slab *statusSlab) (counted, over bool) {
	s, it, st := r.s, &r.items[i], &slab.st
	st.Code = rlsv3.RateLimitResponse_OK
	switch it.kind {
	case noLimit:
		if it.replaced {
			r.why.set(i, ReasonReplaced)
		} else {
			r.why.set(i, ReasonNoRule)
		}
		return false, false
	case unlimited:
		st.LimitRemaining = math.MaxUint32
		s.record(record.Decision{Domain: r.domain, Label: it.label, Outcome: OutcomeUnlimited})
		r.why.set(i, OutcomeUnlimited)
		return false, false
	}
	st.CurrentLimit = &slab.lim
	// The response's limit is a uint32: a larger budget shows as its
	// most (headers and remaining counts carry the whole value).
	st.CurrentLimit.Name, st.CurrentLimit.RequestsPerUnit = it.name, uint32(min(it.rpu, math.MaxUint32))
	st.CurrentLimit.Unit = rlsv3.RateLimitResponse_RateLimit_Unit(it.unit)
	if it.mult > 1 {
		st.CurrentLimit.UnitMultiplier = wrapperspb.UInt32(it.mult)
	}
	cs := &r.states[it.check]
	d := record.Decision{Domain: r.domain, Label: it.label, Rule: it.rule, Entries: r.descs[i].GetEntries(), Hits: it.hits,
		Counted: true, Refund: it.refund, Cached: cs.cached}
	if !it.refund {
		d.HitsResult = hitsResult(&r.checks[it.check], cs, r.stored)
	}
	switch {
	case cs.cached:
		over, d.Outcome = true, OutcomeLocalCache
		st.DurationUntilReset = ceilSeconds(&slab.dur, cs.until.Sub(r.now))
	case cs.failed:
		over, d.Outcome = s.failureAnswer(it)
	default:
		over, d.Outcome = r.decided(it, cs, st, &d)
		st.DurationUntilReset = untilReset(&slab.dur, it.algo, cs.res.ResetUS)
	}
	if over && it.shadow {
		over, d.Outcome, d.Shadow = false, OutcomeShadow, true
	}
	s.record(d)
	r.why.set(i, d.Outcome)
	switch {
	case cs.cached:
		r.why.reset(i, cs.until.Sub(r.now).Microseconds())
	case !cs.failed:
		r.why.reset(i, cs.res.ResetUS)
	}
	if over {
		st.Code = rlsv3.RateLimitResponse_OVER_LIMIT
	}
	return true, over
}

// decided is the status of an item the store decided: over or not, the
// remaining count, near_limit, and what d reports of it (the counter's
// use before its hits).
func (r *responder) decided(it *item, cs *checkState, st *rlsv3.RateLimitResponse_DescriptorStatus, d *record.Decision) (over bool, outcome string) {
	outcome = OutcomeOK
	ch := &r.checks[it.check]
	remaining := cs.res.Remaining
	if !ch.Refund && !it.refund {
		over = cs.res.Over
		if cs.read {
			over = ch.Hits > cs.res.Remaining
		}
		if it.after > 0 && !ch.Charge() {
			// A counter named again later in the request: this
			// occurrence is answered as the incumbent answers each in
			// turn, as if the later ones had not come yet. Admitted, it
			// has their hits left too; refused (nothing consumed), it
			// fits when its hits and the earlier ones' do.
			upto := ch.Hits - min(ch.Hits, it.after)
			switch {
			case !over:
				remaining += it.after
			case !ch.HeldByFlights(cs.res) && upto <= cs.res.Remaining:
				over, remaining = false, cs.res.Remaining-upto
			}
		}
		// The counter's use before these hits: they were consumed only
		// when the request was not refused.
		before := cs.res.Used(it.rpu)
		if !over && !cs.read {
			before -= min(before, it.hits)
		}
		d.Stored, d.Limit, d.Before, d.Over = true, it.rpu, before, over
	}
	switch {
	case !over:
		st.LimitRemaining = uint32(min(remaining, math.MaxUint32))
		if float64(remaining) <= (1-r.s.opts.NearLimitRatio)*float64(it.rpu) {
			outcome = OutcomeNearLimit
		}
	case !cs.read && ch.HeldByFlights(cs.res):
		// Refused for the budget's streams in flight, not a spent
		// budget: what is left is real, and the reset is when a flight
		// ends.
		outcome = OutcomeOverLimit
		st.LimitRemaining = uint32(min(cs.res.Remaining, math.MaxUint32))
	default:
		outcome = OutcomeOverLimit
	}
	return over, outcome
}

// explanation is --decision-metadata's account of a request, one entry
// a descriptor (nil when off): {rule, reason} and, for a descriptor
// decided against a counter, reset_us, the exact µs to its reset
// (duration_until_reset is whole seconds).
type explanation []any

func newExplanation(on bool, items []item) explanation {
	if !on {
		return nil
	}
	e := make(explanation, len(items))
	for i := range items {
		e[i] = map[string]any{"rule": items[i].label}
	}
	return e
}

func (e explanation) set(i int, reason string) {
	if e != nil {
		e[i].(map[string]any)["reason"] = reason
	}
}

func (e explanation) reset(i int, us int64) {
	if e != nil {
		e[i].(map[string]any)["reset_us"] = float64(max(us, 0))
	}
}
