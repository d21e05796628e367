package global

import (
	"context"
	"math"
	"time"

	"github.com/ratelimitd/ratelimitd/internal/limit"
)

// afterEnd is how long after a window's end, as this clock has it, the
// next window's draws leave: that end is early by the one-way trip of
// the draw that learned it, so a draw leaving then lands at the home as
// its window turns.
const afterEnd = 5 * time.Millisecond

// fairShare is the most of what remains at the home one draw may take:
// an instance cannot know how many others draw on the counter, so it
// never takes more than 1/fairShare of the rest, and draws shrink as the
// window's budget runs out.
const fairShare = 4

// run tops grants up every half refresh, as a window ends (the next
// window's draws then leave at once: what the last one held is void),
// and when a request found too little or soon will, until Close.
func (s *Store) run() {
	tick := time.NewTicker(max(s.opts.Refresh/2, time.Millisecond))
	defer tick.Stop()
	windowEnd := time.NewTimer(time.Hour)
	defer windowEnd.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-tick.C:
		case <-s.wake:
		case <-windowEnd.C:
		}
		s.pass(false)
		s.mu.Lock()
		next := s.nextEnd
		s.mu.Unlock()
		if d := next.Sub(s.now()); !next.IsZero() && d < s.opts.Refresh/2 {
			windowEnd.Reset(max(d, 0))
		}
	}
}

// pass makes one round of draws and give-backs, in one call to the home.
// With all, everything held is given back (Close).
func (s *Store) pass(all bool) {
	s.mu.Lock()
	now := s.now()
	ops, es := s.passOps(now, all)
	s.mu.Unlock()
	if len(ops) > 0 {
		s.send(ops, es, all)
	}
}

// send makes one call to the home with ops and takes the answers in.
func (s *Store) send(ops []limit.GrantOp, es []*entry, all bool) {
	ctx, cancel := context.WithTimeout(context.Background(), s.opts.HomeTimeout)
	start := s.now()
	out, err := s.home.GrantWithin(ctx, ops)
	cancel()
	s.mu.Lock()
	defer s.mu.Unlock()
	s.homeAnswered(err, start)
	for i, e := range es {
		op := &ops[i]
		e.inFlight--
		if !op.Settle && !op.GiveBack {
			e.asking -= min(e.asking, op.Check.Hits)
		}
		e.wakeWaiters()
		var r limit.GrantResult
		if err == nil {
			r = out[i]
		}
		switch {
		case op.Settle:
			s.settled(e, op, r, err, all)
		case err != nil && op.GiveBack:
			// It may have been run: given back again, the hits would be
			// returned twice and granted again elsewhere, over the limit.
			s.m.hits("lost", op.Check.Hits)
		case err != nil:
			// It may have been run too: those hits are spent at the home.
			s.m.grant("failed")
			s.m.hits("unanswered", op.Check.Hits)
		case op.GiveBack:
			s.m.hits("given_back", r.Hits)
			s.m.hits("lost", op.Check.Hits-r.Hits)
			s.m.grant("returned")
			if !all && e.avail == 0 && e.owed() == 0 && e.inFlight == 0 && e.waiting == 0 && s.now().Sub(e.lastUse) > s.idleAfter() {
				delete(s.entries, e.check.Key)
			}
		default:
			s.granted(e, op.Check.Hits, r, start)
		}
	}
}

// settled takes a settle's answer in: counted at the home, or dropped
// there (charged more than a window ago); on failure it is sent again,
// with the same seq, by the next pass, or abandoned when closing (all).
// Called with mu held.
func (s *Store) settled(e *entry, op *limit.GrantOp, r limit.GrantResult, err error, all bool) {
	if err != nil {
		s.m.grant("failed")
		if all {
			s.m.hits("abandoned", op.Check.Hits)
			s.log.Error("global: usage charged beyond what was held did not reach the home Redis before closing; it is not counted there",
				"key", e.check.Key, "hits", op.Check.Hits, "err", err)
		}
		return
	}
	e.settling = nil
	if r.Hits == 0 {
		s.m.hits("expired", op.Check.Hits)
	} else {
		s.m.hits("settled", r.Hits)
	}
	if r.WindowEndUS == e.windowEnd && e.latest(r) {
		e.remaining = r.Remaining
		if r.Remaining == 0 {
			e.dryUntil = e.resetAt
		}
	}
}

// homeAnswered keeps the home's state: its round trip, and whether it
// counts as out (calls failing for OutAfter). Called with mu held.
func (s *Store) homeAnswered(err error, start time.Time) {
	now := s.now()
	if err == nil {
		rtt := now.Sub(start)
		if s.rtt == 0 {
			s.rtt = rtt
		} else {
			s.rtt = (3*s.rtt + rtt) / 4
		}
		s.failingSince = time.Time{}
		if s.out {
			s.out = false
			s.m.setOut(false)
			s.log.Info("global: the home Redis answers again; global limits are drawn from it")
		}
		return
	}
	if s.failingSince.IsZero() {
		s.failingSince = start
	}
	if !s.out && now.Sub(s.failingSince) >= s.opts.OutAfter {
		s.out = true
		s.m.setOut(true)
		policy := "deny: global checks beyond what is held are refused"
		if s.opts.Policy == Share {
			policy = "share: global checks beyond what is held are decided in this region against its share"
		}
		s.log.Error("global: the home Redis cannot be reached; spending what is held, then "+policy, "failing_for", now.Sub(s.failingSince), "err", err)
	}
}

// passOps returns the draws and give-backs due, their entries marked in
// flight. Called with mu held.
func (s *Store) passOps(now time.Time, all bool) (ops []limit.GrantOp, es []*entry) {
	idleAfter := s.idleAfter()
	lead := s.opts.Refresh + s.rtt
	s.nextEnd = time.Time{}
	for k, e := range s.entries {
		s.noteEnd(e, now)
		if e.inFlight > 0 {
			continue
		}
		s.age(e, now, all)
		for _, op := range s.settleOps(e, all) {
			ops, es = append(ops, op), append(es, e)
			e.inFlight++
		}
		idle := now.Sub(e.lastUse) > idleAfter
		switch {
		case e.avail > 0 && (all || idle):
			ops, es = append(ops, e.giveBack(e.avail)), append(es, e)
		case e.avail > e.hold() && now.Before(e.validTill) && e.pooled(now):
			// What this instance holds beyond a stream goes back to the
			// pool, for the checks short of one elsewhere.
			ops, es = append(ops, e.giveBack(e.avail-e.hold())), append(es, e)
		case all:
		case idle:
			if e.quiet() {
				delete(s.entries, k)
			}
		default:
			n := s.drawSize(e, now, lead)
			// A budget's checks are decided on what the home had left:
			// it is read every refresh, drawn from or not.
			if n > 0 || e.usage && now.Sub(e.heard) >= s.opts.Refresh {
				ops = append(ops, limit.GrantOp{Check: e.check.WithHits(n)})
				es = append(es, e)
				e.inFlight++
				e.asking += n
			}
		}
	}
	s.m.setCounters(len(s.entries))
	return ops, es
}

// noteEnd keeps the earliest end of a window held (the next window's
// draws leave then). Called with mu held.
func (s *Store) noteEnd(e *entry, now time.Time) {
	if next := e.resetAt.Add(afterEnd); next.After(now) && (s.nextEnd.IsZero() || next.Before(s.nextEnd)) {
		s.nextEnd = next
	}
}

// giveBack returns the op giving back k of the hits e holds, marked in
// flight; all of them, the grant is replaced (what was used of it can no
// longer be refunded to it). Called with mu held.
func (e *entry) giveBack(k uint64) limit.GrantOp {
	op := limit.GrantOp{Check: e.check.WithHits(k), GiveBack: true, WindowEndUS: e.windowEnd}
	e.avail -= k
	if e.avail == 0 {
		e.used = 0
		e.gen++
	}
	e.inFlight++
	return op
}

// age brings e to now before a pass: its demand measured, its flights
// expired (closing, all of them), and what it holds dropped once its
// window has ended. Called with mu held.
func (s *Store) age(e *entry, now time.Time, all bool) {
	if e.Rate > 0 || e.Asked >= firstRateHits || now.Sub(e.From) >= time.Second {
		e.Measure(now, s.opts.Refresh/4)
	}
	if all {
		// Closing: the streams in flight end at other instances, which
		// pay their charges; what they held here goes back.
		e.expireFlights(now, -1)
	} else {
		e.expireFlights(now, flightTimeout(e.check.FlightS))
	}
	if e.avail > 0 && !now.Before(e.validTill) {
		// The window ended, as far as this clock can tell: its hits can
		// be used in no other, nor given back.
		s.m.hits("lost", e.avail)
		e.avail, e.used = 0, 0
		e.gen++
	}
}

// settleOps returns the settles of e due: the one sent before and not
// answered, or else the oldest debt, given the next seq; closing (all),
// every debt.
func (s *Store) settleOps(e *entry, all bool) []limit.GrantOp {
	var ops []limit.GrantOp
	for {
		if e.settling == nil && len(e.debts) > 0 {
			if !all && s.repayable(e, s.now()) {
				return ops
			}
			e.seq++
			d := e.debts[0]
			d.seq = e.seq
			e.debts = e.debts[1:]
			e.settling = &d
		}
		if e.settling == nil {
			return ops
		}
		d := e.settling
		ops = append(ops, limit.GrantOp{Check: e.check.WithHits(d.hits), Settle: true, Settler: s.id, Seq: d.seq, WindowEndUS: d.end})
		if !all {
			return ops
		}
		e.settling = nil // every debt goes in this call
	}
}

// repayable reports that e's oldest debt not yet sent is of the window
// in force, owed less than repayWithin refreshes ago and more than two
// leads from the window's end: it is paid here from the hits held as
// they come back (what streams charged below their holds) or are drawn
// (counted at the home when granted), not settled there on top of what
// was granted. A debt not paid by then is settled, so that the home's
// count trails the charges by at most that. Called with mu held.
func (s *Store) repayable(e *entry, now time.Time) bool {
	d := &e.debts[0]
	return e.inForce(d) && now.Sub(d.at) < repayWithin*s.opts.Refresh &&
		now.Before(e.resetAt.Add(-2*(s.opts.Refresh+s.rtt)))
}

// firstRateHits is how many hits a counter's first rate is measured
// from before a second has passed: one request in a quarter refresh
// reads as 16 a second, and the passes would draw a dozen hits for it,
// held here until the key goes idle while other instances' requests on
// it find the home short.
const firstRateHits = 4

// repayWithin is how many refreshes a debt waits to be paid here before
// it is settled at the home.
const repayWithin = 4

// idleAfter is how long a counter goes unasked before what is held goes
// back and the store forgets it: long enough that a counter asked about
// once a second or two keeps its grant and its measured demand (forgot,
// its next request finds nothing held and waits a round trip, refused).
func (s *Store) idleAfter() time.Duration {
	return max(5*time.Second, 4*s.opts.Refresh)
}

// drawSize is how many hits to draw for e now: enough to hold one to two
// leads (the refresh and the home's round trip) at the demand seen, but
// no more than the rest of the window would use (hits held when it ends
// are lost to every region); never more than 1/fairShare of what
// remains, and none while the counter is dry or what is held covers a
// lead.
func (s *Store) drawSize(e *entry, now time.Time, lead time.Duration) uint64 {
	if now.Before(e.dryUntil) {
		return 0
	}
	if e.inTail(now) {
		return 0 // a draw would land in the window's tail, and be void
	}
	span := 2 * lead
	if now.Before(e.resetAt) {
		span = min(span, e.resetAt.Sub(now))
	} else {
		e.remaining = e.check.Limit // a new window: what it holds is not known yet
	}
	pooled := e.pooled(now)
	var want uint64
	if pooled {
		// A stream at a time, for the checks that wait on it.
		want = max(e.waiting, e.hold())
	} else {
		want = uint64(math.Ceil(e.Rate * min(lead, span).Seconds()))
		want = max(want, e.Asked, e.waiting, 1) // a new counter: what it was asked so far
		// A budget check holds a stream's hold whole: hold two, so
		// that the next check finds one while the draw for more is on
		// its way.
		want = max(want, 2*e.hold())
	}
	want += e.owedNow() + e.carrying(now)
	if now.Before(e.validTill) && e.avail >= want {
		return 0
	}
	target := want
	if !pooled {
		target = max(uint64(math.Ceil(e.Rate*span.Seconds())), want)
	}
	n := target - min(e.avail, target)
	if cap := e.remaining / fairShare; n > cap {
		// Requests waiting for hits are demand in hand, not a hoard:
		// they are drawn for past the fair share.
		n = max(cap, min(n, e.remaining, max(e.waiting, 1)))
	}
	return n
}

// inTail reports that the window of what e holds has ended on this
// clock but may not have at the home yet: a draw made now could land in
// it and be void.
func (e *entry) inTail(now time.Time) bool {
	return !now.Before(e.validTill) && now.Before(e.resetAt.Add(afterEnd))
}

// granted takes a draw's answer in (a read's, asked 0): the hits held, until when they may be
// used (on this clock, from when the call was sent), and what the home
// counter has left. Called with mu held.
func (s *Store) granted(e *entry, asked uint64, r limit.GrantResult, start time.Time) {
	s.m.hits("granted", r.Hits)
	switch {
	case asked == 0:
		s.m.grant("read")
	case r.Hits == 0:
		s.m.grant("empty")
	default:
		s.m.grant("taken")
	}
	e.heard = s.now()
	reset := time.Duration(r.ResetUS) * time.Microsecond
	if r.WindowEndUS != e.windowEnd {
		if e.avail > 0 {
			s.m.hits("lost", e.avail)
		}
		e.avail, e.used = 0, 0
		e.gen++
	}
	e.windowEnd = r.WindowEndUS
	// The script ran after start: the window ends no sooner than this on
	// this clock.
	e.validTill = start.Add(reset - margin)
	e.avail += r.Hits
	s.m.hits("charged", e.repay())
	e.carry()
	e.resetAt = start.Add(reset)
	if !e.latest(r) {
		return
	}
	e.remaining = r.Remaining
	if r.Remaining == 0 {
		e.dryUntil = e.resetAt
	} else {
		e.dryUntil = time.Time{} // given back by others since
	}
}

// latest reports that r, an answer of the home in e's window, was run
// there after every answer taken in so far: calls under way at once
// (cold draws, a pass) may be answered out of order, and the remaining
// of one run earlier is stale (taken in last, a spent counter would
// look as if it had room, or the reverse). The home's clock orders
// them: the later run is nearer the window's end (a token bucket, with
// no window, is taken as it comes). Called with mu held.
func (e *entry) latest(r limit.GrantResult) bool {
	if r.WindowEndUS == 0 || r.WindowEndUS != e.heardEnd || r.ResetUS <= e.heardReset {
		e.heardEnd, e.heardReset = r.WindowEndUS, r.ResetUS
		return true
	}
	return false
}

// flightTimeout is how long a budget check stays in flight without its
// charge: the rule's (--usage-timeout), else five minutes.
func flightTimeout(flightS int64) time.Duration {
	if flightS <= 0 {
		return 5 * time.Minute
	}
	return time.Duration(flightS) * time.Second
}
