package rlqs

import (
	"context"
	"math"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"

	"github.com/ratelimitd/ratelimitd/config"
	"github.com/ratelimitd/ratelimitd/internal/limit"
)

// keep reports whether the grant the Envoy holds is to stay. A replaced
// grant's unused tokens are lost to the window (Envoy drops them with the
// bucket, and what it spent of them in flight is unknown, so they cannot
// be given back safely), and a grant kept too long runs dry before the
// next report can renew it. Which costs more depends on the counter:
//
//   - a grant that lasts to the Envoy's next report stays (give or take
//     rounding: a token, or 40 % of a period's demand when that is less);
//   - one that does not stays while the counter will run out this window
//     (see [Session.runsOut]) and the grant is not yet spent at the
//     bucket's demand since its last report: every token counts, a dry
//     bucket's share waits in the counter for the others, and the grant
//     is replaced when it is expected spent (b.dry wakes the session
//     then), so that what the Envoy drops with it is about nothing;
//   - otherwise it is replaced now, before it runs dry.
func (ss *Session) keep(b *bucket, now time.Time) bool {
	b.dry = time.Time{}
	if b.sent != sentTokens || b.granted == 0 || !now.Before(b.expires) || b.used >= b.granted {
		return false
	}
	left := float64(b.granted - b.used)
	if b.rate < 0 {
		return true
	}
	need := b.rate * ReportPeriod.Seconds()
	if left+min(1, 0.4*need) >= need {
		return true
	}
	if b.rate == 0 || !ss.runsOut(b, now, left) {
		return false
	}
	// Past its expiry the grant is renewed anyway: no wake beyond it (a
	// slow bucket's seconds to spend would overflow a Duration).
	secs := min(left/b.rate, b.expires.Sub(b.lastReport).Seconds())
	spent := b.lastReport.Add(time.Duration(secs * float64(time.Second)))
	if !spent.After(now) {
		return false
	}
	b.dry = spent
	return true
}

// runsOut reports whether the bucket's counter will run out before its
// window ends, by either of two measures: what this instance sees (the
// bucket's share of what is left, with what it holds, is under 90 % of
// its demand to the window's end), or what the counter's own count says
// across every instance and RLS caller on it: its use so far, at the
// rate it came (grants run two report periods ahead of the demand they
// serve), reaches 90 % of the limit by the window's end. The second sees
// the demand of the Envoys on other instances, which the first does not:
// with three instances each saw one Envoy of three, judged the counter
// far from spent, and replaced grants still holding tokens.
func (ss *Session) runsOut(b *bucket, now time.Time, left float64) bool {
	d := ss.demand(b, now)
	if d.avail+left < 0.9*b.rate*d.windowLeft.Seconds() {
		return true
	}
	c := &b.plan.Check
	if d.windowLeft <= 0 || c.Algorithm != limit.FixedWindow {
		return false
	}
	start, _ := c.Window(now.Add(d.windowLeft).UnixMicro() - 1)
	elapsed := now.Sub(time.UnixMicro(start))
	ahead := 2 * ReportPeriod
	used := float64(c.Limit - min(c.Limit, d.remaining))
	rate := used / max(elapsed+ahead, time.Second).Seconds()
	return used+rate*max(0, (d.windowLeft-ahead).Seconds()) >= 0.9*float64(c.Limit)
}

// holds reports whether the Envoy may still hold tokens of the bucket's
// grant: it may have got the grant up to a margin after it was sent, so
// its assignment may run that much past b.expires; and a report spanning
// the grant's arrival counts as spent from the grant only the part after
// the latest the grant could have arrived (used, which sizes grants,
// counts it from when it was sent: a fair guess, but one that took a
// grant for spent with the Envoy still holding tokens, and a DENY_ALL
// then threw them away).
func (b *bucket) holds(now time.Time) bool {
	return b.sent == sentTokens && now.Before(b.heldTill) && b.granted > b.spent
}

// claim is a bucket's claim on what its counter has left.
type claim struct {
	// want is what the bucket would ask for: its demand until the report
	// after its next one, so that a grant runs out as the one replacing
	// it arrives.
	want float64
	// avail is its share of what the counter has left: its share of the
	// demand on the counter here (its buckets' and the RLS callers'), at
	// least an even share.
	avail float64
	// windowLeft is how long the counter's window has to run (0: not
	// known).
	windowLeft time.Duration
	// remaining is what the counter had left after its last grant, of
	// every instance's (the limit while windowLeft is not known).
	remaining uint64
}

// demand returns the bucket's claim at now.
func (ss *Session) demand(b *bucket, now time.Time) claim {
	s := ss.srv
	c := &b.plan.Check
	var cl claim
	s.mu.Lock()
	subs, remaining, share := 1.0, c.Limit, 1.0
	if ctr := s.counters[b.subscribed]; ctr != nil {
		s.measureRLSLocked(b.subscribed, ctr, now)
		rls := max(0, ctr.rls.rate)
		subs = float64(max(1, ctr.subs))
		if rls > 0 {
			subs++ // the RLS callers, as one more claimant
		}
		share = 1 / subs
		if now.Before(ctr.validTill) {
			remaining = ctr.remaining
			cl.windowLeft = ctr.validTill.Sub(now)
		}
		if b.rate > 0 && ctr.rateSum+rls > 0 {
			share = max(share, min(1, b.rate/(ctr.rateSum+rls)))
		}
	}
	s.mu.Unlock()
	if b.rate >= 0 {
		next := max(0, b.lastReport.Add(ReportPeriod).Sub(now).Seconds())
		cl.want = b.rate * (next + ReportPeriod.Seconds())
		if b.rate*ReportPeriod.Seconds() < 2 {
			// Under two requests a period, rounding to whole tokens
			// leaves the bucket dry for most of one: a token to spare.
			cl.want++
		}
	} else {
		// Not measured yet: the bucket's even share of the rule's rate
		// over two report periods, and at least what its first report
		// asked for.
		cl.want = max(float64(b.firstCount), float64(c.Limit)*2*ReportPeriod.Seconds()/(float64(c.WindowUS)/1e6)/subs)
	}
	cl.avail, cl.remaining = float64(remaining)*share, remaining
	return cl
}

// size is how many hits to ask for: what the bucket wants, never more
// than its share of what remains, at least one.
func (ss *Session) size(b *bucket, now time.Time) uint64 {
	d := ss.demand(b, now)
	n := uint64(min(math.Ceil(d.want), float64(limit.MaxHits)))
	return max(1, min(n, uint64(d.avail)))
}

// grant takes grants for need in one store call and returns the actions
// that hand them out.
func (ss *Session) grant(ctx context.Context, now time.Time, need []*bucket) []*rlqsv3.RateLimitQuotaResponse_BucketAction {
	if len(need) == 0 {
		return nil
	}
	s := ss.srv
	ops := make([]limit.GrantOp, len(need))
	for i, b := range need {
		b.needed = false
		ops[i].Check = b.plan.Check
		ops[i].Check.Hits = ss.size(b, now)
	}
	res, err := s.store.Grant(ctx, ops)
	var out []*rlqsv3.RateLimitQuotaResponse_BucketAction
	if err != nil {
		s.log.Warn("rlqs: the store cannot grant; answering by failure mode", "buckets", len(need), "err", err)
		ttl := s.failureTTL(now)
		for _, b := range need {
			s.m.RLQSGrant("failed", 0)
			if a := ss.failure(b, now, ttl); a != nil {
				out = append(out, a)
			}
		}
		return out
	}
	s.failingSince.Store(0)
	var back []limit.GrantOp
	for i, b := range need {
		r := res[i]
		reset := time.Duration(r.ResetUS) * time.Microsecond
		windowed := b.plan.Check.Algorithm != limit.TokenBucket
		ttl := 2 * ReportPeriod
		if windowed {
			ttl = (reset - s.opts.Margin).Truncate(time.Second)
		}
		if r.WindowEndUS != 0 || !windowed {
			s.noteRemaining(b.subscribed, r.Remaining, now.Add(reset))
		}
		switch {
		case r.Hits == 0 || ttl < time.Second:
			if r.Hits == 0 {
				s.m.RLQSGrant("empty", 0)
			} else {
				// Too near the window's end to hand out: give the hits
				// back.
				s.m.RLQSGrant("returned", r.Hits)
				op := ops[i]
				op.Check.Hits, op.GiveBack, op.WindowEndUS = r.Hits, true, r.WindowEndUS
				back = append(back, op)
			}
			if a := ss.denyUnlessHeld(b, now, reset); a != nil {
				out = append(out, a)
			}
		default:
			s.m.RLQSGrant("taken", r.Hits)
			if b.sent == sentTokens || b.foreign {
				// What the replaced grant had left by the Envoy's last
				// report: an upper bound of the hits it never spent
				// (used may pass granted: a report spanning the grant's
				// arrival counts requests from before it).
				if b.holds(now) {
					s.m.RLQSGrantLost(b.granted - min(b.granted, b.used))
				}
				// A token bucket replacing one would carry the old
				// one's tokens over: end it first.
				out = append(out, ss.assign(b, denyAll(), ttl, sentDeny))
			}
			out = append(out, ss.assign(b, tokens(r.Hits, ttl), ttl, sentTokens))
			b.granted, b.used, b.spent, b.sentAt, b.expires = r.Hits, 0, 0, now, now.Add(ttl)
			b.heldTill = b.expires.Add(s.opts.Margin)
			if windowed {
				b.wake = now.Add(reset)
			}
		}
	}
	if len(back) > 0 {
		if _, err := s.store.Grant(ctx, back); err != nil {
			s.log.Warn("rlqs: a grant taken too late in its window could not be given back", "err", err)
		}
	}
	return out
}

// denyUnlessHeld denies the bucket until its counter has budget again,
// unless the Envoy may still hold tokens charged to the counter: a
// DENY_ALL would throw them away. They run out (an empty token bucket
// denies) or expire; the DENY_ALL comes once they surely have, so that a
// permissive config's expired assignment does not admit all, or the
// next window's grant comes first.
func (ss *Session) denyUnlessHeld(b *bucket, now time.Time, reset time.Duration) *rlqsv3.RateLimitQuotaResponse_BucketAction {
	if !b.holds(now) {
		return ss.denyUntil(b, now, reset)
	}
	b.wake = now.Add(max(reset, time.Second))
	if b.heldTill.Before(b.wake) {
		b.wake = b.heldTill
	}
	return nil
}

// denyUntil denies the bucket until its counter has budget again (the
// next window, or the bucket's next hit) and wakes the session then. A
// token bucket rule's is a second from now at the soonest: its next hit
// may be due in a millisecond, and asking for it hit by hit would load
// Redis. A window's is its end (minWindowWake at the soonest): a
// DENY_ALL sent a moment before it would otherwise hold the bucket a
// second into the next window.
func (ss *Session) denyUntil(b *bucket, now time.Time, reset time.Duration) *rlqsv3.RateLimitQuotaResponse_BucketAction {
	// TTLs are whole seconds: the first one at or after the window's
	// end, when the wake's grant replaces it anyway.
	ttl := max(time.Second, (reset+time.Second-1)/time.Second*time.Second)
	soonest := time.Second
	if b.plan.Check.Algorithm != limit.TokenBucket {
		soonest = minWindowWake
	}
	b.wake = now.Add(max(reset, soonest))
	return ss.assign(b, denyAll(), ttl, sentDeny)
}

// minWindowWake keeps a window's wake from spinning when the store's
// window has not yet turned at the session's (clocks a moment apart).
const minWindowWake = 50 * time.Millisecond

// failure answers by the bucket's failure mode for ttl, and asks the
// store again halfway through it (half a second at the soonest), so
// that a grant replaces the answer before it ends once the store is
// back. A bucket whose Envoy still holds tokens of a grant keeps them:
// the failure mode's answer would throw them away (DENY_ALL) or lift
// the limit (ALLOW_ALL) for a hiccup; it is asked about again in a
// second.
func (ss *Session) failure(b *bucket, now time.Time, ttl time.Duration) *rlqsv3.RateLimitQuotaResponse_BucketAction {
	if b.holds(now) {
		b.wake = now.Add(time.Second)
		return nil
	}
	b.wake = now.Add(max(ttl/2, 500*time.Millisecond))
	if b.plan.Failure == config.FailureDeny {
		return ss.assign(b, denyAll(), ttl, sentDeny)
	}
	return ss.assign(b, allowAll(), ttl, sentAllow)
}
