package redisstore

import (
	"context"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/ratelimitd/ratelimitd/internal/lease"
	"github.com/ratelimitd/ratelimitd/internal/limit"
	"github.com/ratelimitd/ratelimitd/internal/metrics"
)

// Leases (docs/ARCHITECTURE.md, "Leased budgets"): for a check whose rule
// has lease: true, the store holds a grant, hits taken from the counter
// in Redis by grant.lua, and decides requests against it in process.
// The grants of a window add up to at most the limit, and a grant is used
// only inside the window it was taken in (as this process's clock can
// tell it, conservatively), so the fleet never admits more than the limit.

// Lease defaults.
const (
	// maxLeaseEntries bounds the counters a store tracks for leases: a
	// leased rule keyed by client address would otherwise grow the map
	// without bound. Counters beyond it are decided exactly.
	maxLeaseEntries = 100_000
	// leaseMargin is how long before its window ends, on this process's
	// clock, a grant stops being used: it covers the drift between this
	// clock and Redis's over one window.
	leaseMargin = 2 * time.Millisecond
)

// grant is what the store holds of one leased counter.
type grant struct {
	check limit.Check // the counter; Hits unused
	avail uint64      // hits held, not yet used
	used  uint64      // hits of the held grants used: what a refund may give back to them
	// gen changes when the held hits are replaced (a new window): a
	// reservation made on older hits is not returned to newer ones.
	gen       uint64
	validTill time.Time // the held hits are not used from then on
	windowEnd int64     // on Redis's clock: what a give-back names
	remaining uint64    // the counter's remaining in Redis, last heard
	resetAt   time.Time // when the window ends (a bucket: one more hit)
	dryUntil  time.Time // nothing to take until then (the budget is gone)

	// Rate: hits asked for since rateFrom, and the smoothed rate.
	asked    uint64
	rateFrom time.Time
	rate     float64
	lastUse  time.Time
	inFlight bool // a take or give-back is on its way
	granted  bool // a grant was ever taken: the counter is not cold
}

// leases is a store's lease accounting and its refiller.
type leases struct {
	s        *Store
	interval time.Duration
	margin   time.Duration
	now      func() time.Time
	m        *metrics.Metrics

	mu      sync.Mutex
	entries map[string]*grant
	wake    chan struct{}
}

func newLeases(s *Store, interval time.Duration) *leases {
	l := &leases{s: s, interval: interval, margin: leaseMargin, now: time.Now, m: s.m,
		entries: map[string]*grant{}, wake: make(chan struct{}, 1)}
	if s.now != nil {
		// A scripted clock (tests) is Redis's own: no drift to cover.
		l.now, l.margin = s.now, 0
	}
	return l
}

// reservation is hits taken from a grant for one request, kept or put
// back once the request is decided.
type reservation struct {
	g    *grant
	gen  uint64
	hits uint64
}

// evaluate decides checks, some of them leased: what the grants hold is
// reserved, what they lack (and the checks without lease) is decided by
// Redis in one call, and the reservations are kept only if Redis admits:
// all or nothing across both.
func (l *leases) evaluate(ctx context.Context, checks []limit.Check) ([]limit.Result, error) {
	p := leasePlan{results: make([]limit.Result, len(checks))}
	l.mu.Lock()
	// The clock is read once the lock is held: a request that waited for
	// it (or was paused before) while its window ended must not use the
	// ended window's grant.
	p.now = l.now()
	for i := range checks {
		l.reserve(&p, checks, i)
	}
	l.mu.Unlock()
	l.noteHow(ctx, &p)
	if len(p.sub) == 0 {
		return p.results, nil
	}
	got, err := l.s.evaluateExact(ctx, p.sub)
	return l.settle(&p, got, err)
}

// leasePlan is one request's way through the leases: what the grants
// reserved, and what Redis decides (the checks without lease and what
// the grants lack of the others; idx says whose each is, grants whose
// grant).
type leasePlan struct {
	now         time.Time
	results     []limit.Result
	res         []reservation
	sub         []limit.Check
	idx         []int
	grants      []*grant
	short, cold bool
}

func (p *leasePlan) toRedis(checks []limit.Check, i int, g *grant, hits uint64) {
	c := checks[i]
	c.Hits, c.Lease = hits, false
	p.sub, p.idx, p.grants = append(p.sub, c), append(p.idx, i), append(p.grants, g)
}

// reserve decides check i from its grant where the grant holds its hits,
// reserves what it holds, and leaves the rest to Redis. Called with mu
// held.
func (l *leases) reserve(p *leasePlan, checks []limit.Check, i int) {
	c := &checks[i]
	if !c.Lease || c.NoVeto || c.Hits == 0 {
		p.toRedis(checks, i, nil, c.Hits)
		return
	}
	g := l.entry(c, p.now)
	if g == nil {
		p.toRedis(checks, i, nil, c.Hits)
		return
	}
	valid := p.now.Before(g.validTill)
	hits := c.SaturatedHits()
	if c.Refund {
		l.refund(p, checks, i, g, valid, hits)
		return
	}
	g.asked += hits
	var r uint64
	if valid {
		r = min(g.avail, hits)
		g.avail -= r
		g.used += r
		if r > 0 {
			p.res = append(p.res, reservation{g, g.gen, r})
		}
	}
	if r == hits {
		p.results[i] = l.answer(g, p.now)
		return
	}
	// The grant falls short: Redis decides the rest, which holds exactly
	// the decision without a lease (the counter in Redis includes the
	// hits reserved here).
	switch {
	case g.granted:
		p.short = true
	case l.earns(g, p.now):
		p.short = true // warming up: the refiller's next pass grants
	default:
		p.cold = true // decided in Redis until its rate earns a grant
	}
	p.toRedis(checks, i, g, hits-r)
}

// refund gives a leased refund back to the grant, as much of it as this
// process used of its grants (a refund in Redis never goes below zero
// either); the rest to Redis. Refunds apply whatever the request's
// decision, as in decide.lua. Called with mu held.
func (l *leases) refund(p *leasePlan, checks []limit.Check, i int, g *grant, valid bool, hits uint64) {
	var k uint64
	if valid {
		k = min(g.used, hits)
		g.used -= k
		g.avail += k
	}
	if k == hits {
		p.results[i] = l.answer(g, p.now)
		return
	}
	rest := hits - k
	if valid {
		// The rest goes to Redis with what is held here: a refund that
		// empties the counter there must not free the hits of this grant
		// too, which would then be used twice. (Hits held past their
		// window are not the current window's to give back.)
		rest += g.avail
		l.m.LeaseGivenBack(g.avail, 0)
		g.avail, g.used = 0, 0
		g.gen++
	}
	p.toRedis(checks, i, g, rest)
}

// noteHow counts how the request was decided (local, waited for a grant,
// cold) and wakes the refiller when a grant fell short.
func (l *leases) noteHow(ctx context.Context, p *leasePlan) {
	how := "local"
	switch {
	case p.short:
		how = "waited"
		l.kick()
	case p.cold:
		// The refiller's next tick measures the rate: waking it for each
		// request of a cold counter would only walk the map again.
		how = "cold"
	case len(p.sub) > 0:
		how = ""
	}
	if how != "" {
		l.m.LeaseRequest(how)
		if span := trace.SpanFromContext(ctx); span.IsRecording() {
			span.SetAttributes(attribute.String("ratelimit.lease", how))
		}
	}
}

// settle takes Redis's decision of what the grants did not: the
// reservations are kept if the request is admitted, put back otherwise.
func (l *leases) settle(p *leasePlan, got []limit.Result, err error) ([]limit.Result, error) {
	admitted := err == nil
	if err == nil {
		for j, i := range p.idx {
			if got[j].Over && !p.sub[j].NoVeto && !p.sub[j].Refund {
				admitted = false
			}
			p.results[i] = got[j]
		}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if !admitted {
		for _, r := range p.res {
			if r.g.gen == r.gen {
				r.g.avail += r.hits
				r.g.used -= r.hits
			} else {
				l.m.LeaseLost(r.hits) // their window ended meanwhile
			}
		}
		if err != nil {
			return nil, err
		}
		return p.results, nil
	}
	// Redis has the counters' latest word: keep it for the answers.
	for j, g := range p.grants {
		if g != nil {
			g.remaining = got[j].Remaining
			if got[j].Over {
				g.dryUntil = p.now.Add(time.Duration(got[j].ResetUS) * time.Microsecond)
			}
		}
	}
	return p.results, nil
}

// entry returns the grant of c's counter, made on first use, or nil when
// the store tracks too many counters already. Called with mu held.
func (l *leases) entry(c *limit.Check, now time.Time) *grant {
	g := l.entries[c.Key]
	if g == nil {
		if len(l.entries) >= maxLeaseEntries {
			return nil
		}
		g = &grant{check: *c, rateFrom: now, remaining: c.Limit}
		g.check.Hits, g.check.Refund = 0, false
		l.entries[c.Key] = g
	}
	g.lastUse = now
	return g
}

// answer is a leased check's result, decided in process: admitted, the
// best known remaining (the counter's in Redis, plus what is held here;
// approximate: other instances hold grants too), and the exact reset.
func (l *leases) answer(g *grant, now time.Time) limit.Result {
	r := limit.Result{Remaining: g.remaining + g.avail}
	if g.check.Algorithm != limit.TokenBucket {
		r.ResetUS = max(0, g.resetAt.Sub(now).Microseconds())
	}
	return r
}

// kick wakes the refiller.
func (l *leases) kick() {
	select {
	case l.wake <- struct{}{}:
	default:
	}
}

// run refills grants ahead of need, gives back those of idle counters,
// and drops what ended with its window, until done is closed.
func (l *leases) run(done <-chan struct{}) {
	tick := time.NewTicker(max(l.interval/2, time.Millisecond))
	defer tick.Stop()
	for {
		select {
		case <-done:
			return
		case <-tick.C:
		case <-l.wake:
		}
		l.pass(false)
	}
}

// pass makes one round of takes and give-backs, in one script call (one
// per key on Cluster). With all, everything held is given back (Close).
func (l *leases) pass(all bool) {
	now := l.now()
	idleAfter := max(time.Second, 10*l.interval)
	l.mu.Lock()
	ops, gs := l.passOps(now, idleAfter, all)
	if len(ops) > 0 && !all && l.s.breaker.isOpen() {
		// Redis is known down: what is held keeps deciding; asking
		// would only wait.
		for _, g := range gs {
			g.inFlight = false
		}
		ops = nil
	}
	l.mu.Unlock()
	if len(ops) == 0 {
		return
	}
	start := l.now()
	// Refills wait longer than a request would: they are ahead of need,
	// and an answer that comes late still serves.
	ctx, cancel := context.WithTimeout(context.Background(), max(l.s.timeout, 2*l.interval))
	out, err := l.s.grantCall(ctx, ops)
	cancel()
	l.m.LeaseRefill(err == nil)
	l.mu.Lock()
	defer l.mu.Unlock()
	for i, g := range gs {
		g.inFlight = false
		switch {
		case err != nil:
			if ops[i].GiveBack {
				if all {
					l.m.LeaseLost(ops[i].Check.Hits)
				} else {
					g.avail += ops[i].Check.Hits // the next pass tries again
				}
			}
		case ops[i].GiveBack:
			// What did not go back (its window ended meanwhile) is lost.
			l.m.LeaseGivenBack(out[i].Hits, ops[i].Check.Hits-out[i].Hits)
			if !all && now.Sub(g.lastUse) > idleAfter {
				delete(l.entries, g.check.Key)
			}
		default:
			l.granted(g, out[i], start)
		}
	}
}

// passOps walks the counters in use lately (at most maxLeaseEntries:
// those idle for idleAfter leave the map) and returns the takes and
// give-backs due, their grants marked in flight. Called with mu held.
func (l *leases) passOps(now time.Time, idleAfter time.Duration, all bool) (ops []GrantOp, gs []*grant) {
	for k, g := range l.entries {
		if g.inFlight {
			continue
		}
		l.measure(g, now)
		idle := now.Sub(g.lastUse) > idleAfter
		bucket := g.check.Algorithm == limit.TokenBucket
		if g.avail > 0 && !now.Before(g.validTill) && !bucket {
			// The window ended (as far as this clock can tell): its
			// hits cannot be used in the next, nor given back.
			l.m.LeaseLost(g.avail)
			g.avail, g.used = 0, 0
			g.gen++
		}
		switch {
		case g.avail > 0 && (all || idle || (bucket && !now.Before(g.validTill))):
			// The hits leave the grant now: none may be used while they
			// are on their way back.
			ops = append(ops, GrantOp{Check: withHits(g.check, g.avail), GiveBack: true, WindowEndUS: g.windowEnd})
			gs = append(gs, g)
			g.avail, g.used, g.inFlight = 0, 0, true
			g.gen++
		case all:
		case idle:
			delete(l.entries, k)
		default:
			want := lease.GrantSize(g.rate, l.interval, g.remaining)
			// A rate too low to fill a grant of two: decided exactly, as
			// without a lease. Otherwise hold between one and two grants,
			// so a stall shorter than the interval finds hits in hand.
			if want < 2 || g.avail >= want || now.Before(g.dryUntil) {
				continue
			}
			ops = append(ops, GrantOp{Check: withHits(g.check, want)})
			gs = append(gs, g)
			g.inFlight = true
		}
	}
	return ops, gs
}

// granted takes a grant's answer in: the hits held, until when they
// may be used (on this clock, counted from start, when the call was
// sent), and what the counter has left. Called with mu held.
func (l *leases) granted(g *grant, r GrantResult, start time.Time) {
	l.m.LeaseGranted(r.Hits)
	reset := time.Duration(r.ResetUS) * time.Microsecond
	if g.check.Algorithm == limit.TokenBucket {
		// A bucket's tokens have no window: held ones are given back
		// after two intervals, so that what this process admits over
		// any span stays near the bucket's own bound.
		g.validTill = start.Add(2 * l.interval)
	} else {
		if r.WindowEndUS != g.windowEnd {
			if g.avail > 0 {
				l.m.LeaseLost(g.avail)
			}
			g.avail, g.used = 0, 0
			g.gen++
		}
		g.windowEnd = r.WindowEndUS
		// From when the call was sent: the script ran later, so the
		// window ends no sooner than this on this clock.
		g.validTill = start.Add(reset - l.margin)
	}
	g.avail += r.Hits
	g.granted = g.granted || r.Hits > 0
	g.remaining = r.Remaining
	g.resetAt = start.Add(reset)
	if r.Hits == 0 {
		g.dryUntil = g.resetAt
	}
}

// earns reports whether what was asked of g since its rate was last
// measured, over long enough, would earn a grant of two hits. Called
// with mu held.
func (l *leases) earns(g *grant, now time.Time) bool {
	el := now.Sub(g.rateFrom)
	return el >= l.interval/4 && float64(g.asked)*float64(l.interval) >= 2*float64(el)
}

// measure updates g's rate from what was asked of it since the last pass.
// Called with mu held.
func (l *leases) measure(g *grant, now time.Time) {
	el := now.Sub(g.rateFrom)
	if el < l.interval/4 {
		return
	}
	inst := float64(g.asked) / el.Seconds()
	if g.rate == 0 {
		g.rate = inst
	} else {
		g.rate = (g.rate + inst) / 2
	}
	g.asked, g.rateFrom = 0, now
}

func withHits(c limit.Check, n uint64) limit.Check {
	c.Hits = n
	return c
}

// close gives back everything held, once; what cannot go back is lost
// (counted).
func (l *leases) close() { l.pass(true) }
