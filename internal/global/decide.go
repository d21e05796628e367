package global

import (
	"cmp"
	"context"
	"math"
	"time"

	"github.com/ratelimitd/ratelimitd/internal/limit"
)

// plan is one request's way through the store: the global checks decided
// from what is held (res: the hits reserved), the rest sent to Local
// (sub; idx says whose each is).
type plan struct {
	now     time.Time
	results []limit.Result
	res     []reservation
	sub     []limit.Check
	idx     []int
	refused bool // a global check is short: the request is refused
	short   bool // a grant is short, or soon will be: wake the refiller
	// again: decided again after waiting for a draw; its demand was
	// counted the first time.
	again bool
	// cold are the global checks refused only for want of hits held,
	// on counters whose home may have room: with mayWait, the request
	// waits for a draw made on their behalf (coldWait).
	cold    []coldCheck
	mayWait bool
}

// coldCheck is a global check's demand waiting for a draw.
type coldCheck struct {
	e    *entry
	hits uint64
}

type reservation struct {
	e    *entry
	gen  uint64
	hits uint64
	// flight: a budget check's, in flight once the request is admitted.
	flight bool
}

func (p *plan) toLocal(i int, c limit.Check) {
	p.sub, p.idx = append(p.sub, c), append(p.idx, i)
}

type decidedAtKey struct{}

// WithDecidedAt returns ctx asking Evaluate to write into at the moment,
// on the store's clock, it decided the request's global checks: a grant
// is used only inside its window, so that moment says which window an
// admission counts in (the fleet tests and benchmark count by it).
func WithDecidedAt(ctx context.Context, at *time.Time) context.Context {
	return context.WithValue(ctx, decidedAtKey{}, at)
}

// Evaluate decides checks, all or nothing: the global ones from what is
// held (no call to the home), the others in Local, and what is held is
// spent only if Local admits too. A global check that finds too little
// held on a counter whose home may have room (a key asked for the first
// time, or again after it went idle) waits for a draw made at once on
// its behalf, coalesced with the other cold keys' (coldRun), at most
// twice the home's round trip and Options.ColdMargin (coldWait), and is decided again: a
// key with room is not refused for being rarely asked.
func (s *Store) Evaluate(ctx context.Context, checks []limit.Check) ([]limit.Result, error) {
	global := false
	for i := range checks {
		global = global || checks[i].Global
	}
	if !global {
		return s.local.Evaluate(ctx, checks)
	}
	return s.evaluate(ctx, checks, time.Time{})
}

// evaluate is Evaluate; cold checks may wait for draws until then (zero:
// not waited yet). A request may wait for more than one draw: one under
// way when it came, whose size did not count it (the rest of a burst on
// a key asked for the first time), then its own.
func (s *Store) evaluate(ctx context.Context, checks []limit.Check, until time.Time) ([]limit.Result, error) {
	p := plan{results: make([]limit.Result, len(checks)), mayWait: until.IsZero() || time.Now().Before(until), again: !until.IsZero()}
	s.mu.Lock()
	p.now = s.now()
	if at, ok := ctx.Value(decidedAtKey{}).(*time.Time); ok {
		*at = p.now
	}
	for i := range checks {
		if checks[i].Global {
			s.reserve(&p, checks, i)
		} else {
			p.toLocal(i, checks[i])
		}
	}
	var drawn []chan struct{}
	if len(p.cold) > 0 {
		drawn = s.awaitDraws(p.cold)
	}
	s.mu.Unlock()
	if drawn != nil {
		s.putBack(&p)
		return s.evaluate(ctx, checks, s.coldWait(ctx, &p, drawn, until))
	}
	if p.short {
		s.kick()
	}
	if p.refused {
		// Refused here: the others are read, not consumed (charges and
		// refunds apply whatever the decision), as a refusal the local
		// cache knows.
		s.putBack(&p)
		for j := range p.sub {
			if c := &p.sub[j]; !c.Refund && !c.Charge() {
				c.Hits, c.Usage, c.Kind = 0, false, limit.ByHits
			}
		}
	}
	if len(p.sub) == 0 {
		if !p.refused {
			s.fly(&p)
		}
		return p.results, nil
	}
	got, err := s.local.Evaluate(ctx, p.sub)
	if err != nil {
		s.putBack(&p)
		return nil, err
	}
	s.finish(&p, got)
	return p.results, nil
}

// finish takes Local's results in (got) and settles what is held: a
// request admitted by both puts its budget checks in flight; one Local
// refuses gives its reservations back.
func (s *Store) finish(p *plan, got []limit.Result) {
	admitted := !p.refused
	for j, i := range p.idx {
		p.results[i] = got[j]
		if got[j].Over && !p.sub[j].NoVeto && !p.sub[j].Refund {
			admitted = false
		}
	}
	switch {
	case admitted:
		s.fly(p)
	case !p.refused:
		s.putBack(p)
	}
}

// fly puts an admitted request's budget checks in flight.
func (s *Store) fly(p *plan) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, r := range p.res {
		if r.flight && r.e.gen == r.gen {
			r.e.flights = append(r.e.flights, flight{at: p.now, hits: r.hits, gen: r.gen, end: r.e.windowEnd})
		}
	}
}

// reserve decides global check i from what is held, or leaves it to the
// partition share, or refuses it. Called with mu held.
func (s *Store) reserve(p *plan, checks []limit.Check, i int) {
	c := &checks[i]
	e := s.entry(c, p.now)
	if e == nil {
		if c.Charge() {
			s.m.hits("abandoned", c.SaturatedHits())
		}
		p.results[i] = limit.Result{Over: true, ResetUS: s.opts.Refresh.Microseconds()}
		p.refused = p.refused || !c.NoVeto
		return
	}
	valid := p.now.Before(e.validTill)
	hits := c.SaturatedHits()
	switch {
	case c.Refund:
		// What this process used of its grants goes back to them; a
		// refund beyond that has nothing here to return to.
		if valid {
			k := min(e.used, hits)
			e.used -= k
			e.avail += k
		}
		p.results[i] = s.answer(e, p.now)
		return
	case c.Usage && c.Charge():
		s.charge(p, i, c, e)
		return
	case c.Usage && (hits == 0 || c.Kind == limit.CostCheck && e.estimate() > 0):
		s.budgetCheck(p, i, c, e, valid)
		return
	case hits == 0:
		p.results[i] = s.answer(e, p.now)
		return
	}
	if !p.again {
		e.Asked += hits
	}
	if valid && e.avail >= hits {
		e.avail -= hits
		e.used += hits
		p.res = append(p.res, reservation{e: e, gen: e.gen, hits: hits})
		p.results[i] = s.answer(e, p.now)
		s.m.request("local")
		p.short = p.short || s.low(e, 0)
		return
	}
	s.beyondHeld(p, i, c, e)
}

// low reports that e holds less than a lead's worth at the demand seen,
// plus extra: top up now, not at the next tick, so that the draw lands
// before what is held runs out. Called with mu held.
func (s *Store) low(e *entry, extra uint64) bool {
	return float64(e.avail) < e.Rate*(s.opts.Refresh+s.rtt).Seconds()+float64(extra)
}

// beyondHeld answers global check i, which what is held cannot: in the
// region's store against its share while the home is out (share), else
// refused. Called with mu held.
func (s *Store) beyondHeld(p *plan, i int, c *limit.Check, e *entry) {
	p.short = true
	if s.out && s.opts.Policy == Share {
		p.toLocal(i, s.shareCheck(c))
		s.m.request("shared")
		return
	}
	r := limit.Result{Over: true}
	if e.resetAt.After(p.now) {
		r.ResetUS = e.resetAt.Sub(p.now).Microseconds()
	} else {
		// The window's end as this clock has it: the home's not heard.
		now := p.now.UnixMicro()
		r.ResetUS = limit.WindowEnd(now, c.WindowUS) - now
	}
	if (!p.now.Before(e.dryUntil) || s.out) && !c.Usage {
		// Not spent at the home, as far as is known: a retry after the
		// next top-up may pass. (A budget's refusal keeps the window's
		// end, as a region's budget answers it.)
		r.ResetUS = min(max(r.ResetUS, 0), s.opts.Refresh.Microseconds())
	}
	p.results[i] = r
	p.refused = p.refused || !c.NoVeto
	if p.mayWait && !s.out && (e.asking > 0 || !p.now.Before(e.dryUntil) && e.left(p.now) > 0) {
		// Not known spent at the home, nor by what is owed to it, or
		// hits drawn for this instance are on their way (the home,
		// spent by them, answered another draw first): wait for a
		// draw, and decide it again (a shadow or quota-mode check too:
		// its verdict counts).
		p.cold = append(p.cold, coldCheck{e: e, hits: max(c.SaturatedHits(), e.hold(), 1)})
		return
	}
	s.m.request("short")
}

// awaitDraws registers the cold checks' demand (drawn for past the fair
// share: demand in hand, not a hoard) and queues their counters for the
// cold drawer, unless a draw of theirs is under way; it returns what to
// wait on: each counter's next draw. Called with mu held.
func (s *Store) awaitDraws(cold []coldCheck) []chan struct{} {
	drawn := make([]chan struct{}, 0, len(cold))
	for _, c := range cold {
		e := c.e
		e.waiting += c.hits
		if e.drawn == nil {
			e.drawn = make(chan struct{})
		}
		drawn = append(drawn, e.drawn)
		// A draw under way covers the demand it was sized for; more
		// demand gets a draw of its own at once, not after it.
		if !e.queued && (e.inFlight == 0 || e.waiting > e.asking) {
			e.queued = true
			s.coldQ = append(s.coldQ, e)
		}
	}
	select {
	case s.coldWake <- struct{}{}:
	default:
	}
	return drawn
}

// coldWait waits, within ctx and until (zero: from now, twice the home's
// round trip plus Options.ColdMargin, a refresh for a round trip while
// none is known; to a round trip past the window's end, when it ends
// sooner), for the draws of p's cold checks, then withdraws their demand.
// It returns until, or a time past when the draws did not come in it.
func (s *Store) coldWait(ctx context.Context, p *plan, drawn []chan struct{}, until time.Time) time.Time {
	if until.IsZero() {
		s.mu.Lock()
		rtt, now := cmp.Or(s.rtt, s.opts.Refresh), s.now()
		wait := 2*rtt + s.opts.ColdMargin
		for _, c := range p.cold {
			// A window that ends meanwhile voids what was drawn in it:
			// its requests wait for the next window's draw, a round
			// trip after it opens.
			if d := c.e.windowEndAfter(now).Sub(now); d < wait {
				wait = max(wait, d+afterEnd+rtt+s.opts.ColdMargin)
			}
		}
		until = time.Now().Add(wait)
		s.mu.Unlock()
	}
	t := time.NewTimer(time.Until(until))
	defer t.Stop()
	how := "waited"
wait:
	for _, ch := range drawn {
		select {
		case <-ch:
		case <-t.C:
			how = "waited_out"
			break wait
		case <-ctx.Done():
			how = "waited_out"
			break wait
		}
	}
	s.m.request(how)
	s.mu.Lock()
	for _, c := range p.cold {
		c.e.waiting -= min(c.e.waiting, c.hits)
	}
	s.mu.Unlock()
	if how != "waited" {
		return time.Unix(1, 0) // past: no more waiting
	}
	return until
}

// shareCheck is c decided in the region's store against its partition
// share.
func (s *Store) shareCheck(c *limit.Check) limit.Check {
	sc := *c
	sc.Global = false
	sc.Key = "gshare|" + c.Key
	sc.Limit = uint64(math.Floor(float64(c.Limit) * s.opts.Share))
	return sc
}

// budgetCheck decides a global budget's check: a usage rule's call
// stating no hits, or, once this instance has seen the budget charged, a
// request phase that costs its hit (consumed too). Once charges have
// taught what a stream spends, the check holds that much of the grant
// while its stream runs, admitted only if this instance holds it, so
// that the streams in flight in every region are covered by grants,
// which add up to at most the budget; with no stream in flight here, it
// is admitted while the budget has something left, holding what it
// can. Before any charge, it is admitted while this instance holds
// hits, or the home, once heard (never heard, it waits for a read), had some left
// beyond the charges not yet settled there (while the home is out: while
// it holds some), and, stating no hits, while fewer than
// limit.ColdInFlight such checks are in flight here (each ends at a
// charge, or after limit.ColdFlightMS). Called with mu held.
func (s *Store) budgetCheck(p *plan, i int, c *limit.Check, e *entry, valid bool) {
	e.usage = true
	est, cost := e.hold(), c.SaturatedHits() // cost: a request phase's stated 1
	if !p.again {
		e.Asked += est + cost
	}
	var held uint64
	if valid {
		// Charges beyond their holds are paid before another stream
		// is admitted.
		s.m.hits("charged", e.repay())
		held = e.avail
	}
	room := held
	if !s.out && !e.heard.IsZero() {
		// Never heard, what the home has left is not known: the check
		// waits for a read (beyondHeld), not admitted on a guess.
		room += e.left(p.now)
	}
	switch {
	case est == 0 && room > 0 && (cost > 0 || e.charges > 0):
	case est == 0 && room > 0 && len(e.flights) < limit.ColdInFlight:
		// No charge has taught what a stream spends: at most
		// limit.ColdInFlight streams in flight here, holding nothing (a
		// region's budget counts each as a quarter of its limit), else
		// a new budget's first second admits every stream offered.
		p.res = append(p.res, reservation{e: e, gen: e.gen, flight: true})
	case est > 0 && held >= cost && (held >= est+cost || len(e.flights) == 0 && room > cost):
		// The estimate held whole; or, no stream in flight here, what
		// is held of it: the budget's last stream, as a region's budget
		// admits it while something is left.
		h := min(est, held-cost)
		e.avail -= h + cost
		e.used += h + cost
		p.res = append(p.res, reservation{e: e, gen: e.gen, hits: h, flight: true})
		if cost > 0 {
			p.res = append(p.res, reservation{e: e, gen: e.gen, hits: cost})
		}
		p.short = p.short || s.low(e, est)
	default:
		s.beyondHeld(p, i, c, e)
		return
	}
	p.results[i] = s.usageAnswer(e, p.now, valid)
	s.m.request("local")
}

// charge takes a global budget's usage charge, whatever the decision:
// from the hits held, the rest owed to the home and settled there in the
// background. It is over only when the budget was known spent before it.
// Called with mu held.
func (s *Store) charge(p *plan, i int, c *limit.Check, e *entry) {
	hits := c.SaturatedHits()
	left, owed := s.spend(e, hits, p.now)
	p.short = p.short || owed
	r := s.usageAnswer(e, p.now, p.now.Before(e.validTill))
	// Over only when the budget was spent as far as anyone can tell: what
	// the home had left, less what is owed, and what is held here was
	// nothing. Other instances hold hits unused that this one cannot
	// see, so a charge beyond what it sees may well fit the budget.
	r.Over = hits > 0 && left == 0
	p.results[i] = r
	p.refused = p.refused || r.Over && !c.NoVeto
	if s.out && s.opts.Policy == Share {
		// The share is a budget of its own in the region's store: it
		// takes the charge too (the home still has it owed).
		p.toLocal(i, s.shareCheck(c))
	}
	s.m.request("local")
}

// spend takes a usage charge of hits made now on e: it ends the oldest
// flight, whose hold goes back to pay it, takes it from what is held and
// owes the rest to the home. It returns what was left before it (the
// home's, less what is owed, and what is held) and whether any is owed.
// Called with mu held.
func (s *Store) spend(e *entry, hits uint64, now time.Time) (left uint64, owed bool) {
	e.usage = true
	valid := now.Before(e.validTill)
	landed := e.land(hits, valid)
	// The demand the check counted for its stream is the charge's part.
	e.Asked += hits - min(hits, landed)
	left = e.left(now)
	rest := hits
	if valid {
		left += e.avail
		k := min(e.avail, hits)
		e.avail -= k
		rest -= k
		s.m.hits("charged", k)
	}
	if rest == 0 {
		// What came back beyond the charge pays what is owed first.
		s.m.hits("charged", e.repay())
		return left, false
	}
	e.owe(e.chargeWindow(now), rest, now)
	return left, true
}

// usageAnswer is a global budget's result decided here: what the home
// had left beyond the charges owed to it, plus what is held.
func (s *Store) usageAnswer(e *entry, now time.Time, valid bool) limit.Result {
	r := limit.Result{Remaining: e.left(now), ResetUS: max(0, e.resetAt.Sub(now).Microseconds())}
	if valid {
		r.Remaining += e.avail
	}
	return r
}

// putBack returns a refused request's reservations to their grants.
func (s *Store) putBack(p *plan) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, r := range p.res {
		if r.e.gen == r.gen {
			r.e.avail += r.hits
			r.e.used -= r.hits
		} else {
			s.m.hits("lost", r.hits) // its window ended meanwhile
		}
	}
	p.res = nil
}

// answer is a global check's result decided here: the best known
// remaining (the home's, plus what is held here; other instances hold
// some too) and the reset.
func (s *Store) answer(e *entry, now time.Time) limit.Result {
	return limit.Result{Remaining: e.remaining + e.avail, ResetUS: max(0, e.resetAt.Sub(now).Microseconds())}
}
