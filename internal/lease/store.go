package lease

import (
	"context"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/ratelimitd/ratelimitd/internal/fielderr"
	"github.com/ratelimitd/ratelimitd/internal/limit"
)

// Store (docs/ARCHITECTURE.md, "Leased budgets") decides the checks
// whose rule has lease: true from grants it holds, hits taken from the
// counter in its Backend (redisstore's grant.lua), and sends the rest
// to the Backend: it wraps a store as internal/persecond does. The
// grants of a window add up to at most the limit, and a grant is used
// only inside the window it was taken in (as this process's clock can
// tell it, conservatively), so the fleet never admits more than the
// limit. The request path reserves hits from the grants, sends what they
// lack to the Backend and settles (this file); a refiller takes grants
// ahead of need and gives back what idle counters hold (refill.go).

// Backend is the store leases take grants from and send the rest to
// (redisstore.Store).
type Backend interface {
	// Evaluate decides checks, none of them leased, all or nothing.
	Evaluate(ctx context.Context, checks []limit.Check) ([]limit.Result, error)
	// Grant takes and gives back grants within its own timeout (RLQS's
	// use); GrantWithin within ctx's deadline alone (the refiller's,
	// which may wait longer than a request would).
	Grant(ctx context.Context, ops []limit.GrantOp) ([]limit.GrantResult, error)
	GrantWithin(ctx context.Context, ops []limit.GrantOp) ([]limit.GrantResult, error)
	// BreakerOpen reports a Backend known down: the refiller does not
	// ask it meanwhile, and what is held keeps deciding.
	BreakerOpen() bool
}

// Options configures a [Store].
type Options struct {
	// Interval is how long a grant should last at the counter's recent
	// rate (--lease-interval); zero means DefaultInterval.
	Interval time.Duration
	// Timeout is the Backend's own bound on a call: a refill waits at
	// least this long, and twice the interval.
	Timeout time.Duration
	// Metrics receives the lease counts. Nil records nothing.
	Metrics *Metrics
	// Now, when set, is the clock of grants instead of time.Now: the
	// Backend's scripted clock (tests), with no drift to cover.
	Now func() time.Time
}

// Validate refuses options no store can run with.
func (o Options) Validate() error {
	switch {
	case o.Interval < 0:
		return fielderr.Errorf("lease", "Interval", "%v: want positive", o.Interval)
	case o.Interval > time.Minute:
		return fielderr.Errorf("lease", "Interval", "%v: want at most 1m", o.Interval)
	}
	return nil
}

// Store is a Backend with leases. It is safe for concurrent use.
type Store struct {
	b         Backend
	leases    *leases
	leaseStop chan struct{}
	leaseWG   sync.WaitGroup
	closeOnce sync.Once
}

// New wraps b with leases and starts their refiller, until Close.
func New(b Backend, opts Options) *Store {
	iv := opts.Interval
	if iv == 0 {
		iv = DefaultInterval
	}
	l := &leases{b: b, interval: iv, timeout: opts.Timeout, margin: leaseMargin, now: time.Now, m: opts.Metrics,
		entries: map[string]*grant{}, wake: make(chan struct{}, 1)}
	if opts.Now != nil {
		l.now, l.margin = opts.Now, 0
	}
	s := &Store{b: b, leases: l, leaseStop: make(chan struct{})}
	s.leaseWG.Go(func() { s.leases.run(s.leaseStop) })
	return s
}

// Evaluate decides checks: through the grants when one is leased, else
// in the Backend.
func (s *Store) Evaluate(ctx context.Context, checks []limit.Check) ([]limit.Result, error) {
	for i := range checks {
		if checks[i].Lease {
			return s.leases.evaluate(ctx, checks)
		}
	}
	return s.b.Evaluate(ctx, checks)
}

// chargeKeeper keeps usage charges the caller had no time to send
// (redisstore.Store, service.ChargeKeeper).
type chargeKeeper interface {
	KeepCharges(checks []limit.Check) bool
}

// KeepCharges is the Backend's, when it keeps charges: a usage charge is
// never leased, so it is the Backend's to keep.
func (s *Store) KeepCharges(checks []limit.Check) bool {
	k, ok := s.b.(chargeKeeper)
	return ok && k.KeepCharges(checks)
}

// Grant is the Backend's (RLQS takes its grants there).
func (s *Store) Grant(ctx context.Context, ops []limit.GrantOp) ([]limit.GrantResult, error) {
	return s.b.Grant(ctx, ops)
}

// Close stops the refiller and gives back everything held, once; what
// cannot go back is lost (counted). It does not close the Backend.
func (s *Store) Close() error {
	s.closeOnce.Do(func() {
		close(s.leaseStop)
		s.leaseWG.Wait()
		s.leases.pass(true)
	})
	return nil
}

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

	Meter    // the hits asked, and their smoothed rate
	lastUse  time.Time
	inFlight bool // a take or give-back is on its way
	granted  bool // a grant was ever taken: the counter is not cold
}

// leases is a store's lease accounting and its refiller.
type leases struct {
	b        Backend
	interval time.Duration
	timeout  time.Duration
	margin   time.Duration
	now      func() time.Time
	m        *Metrics

	mu      sync.Mutex
	entries map[string]*grant
	wake    chan struct{}
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
	got, err := l.b.Evaluate(ctx, p.sub)
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
	g.Asked += hits
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
		g = &grant{check: *c, Meter: Meter{From: now}, remaining: c.Limit}
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
