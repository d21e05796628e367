// Package global makes a limit one across regions (rate_limit.global,
// docs/regions.md). Each region runs its instances and its Redis; one
// Redis, the home, holds the counter of every global limit. An instance
// never asks the home on a request's path: it decides a global check in
// process from hits it holds, drawn from the home counter ahead of need
// as grants (redisstore's grant.lua: never more than remains in the
// window), topped up in the background by the demand it sees, given back
// when idle. The grants of a window add up to at most the limit, and a
// grant is used only inside the window it was drawn in, so all regions
// together never admit more than the limit. While the home cannot be
// reached, what is held is spent, then the partition policy answers:
// deny (the bound holds), or a static share of the limit decided in the
// region's own store (the overshoot is at most the shares' sum).
package global

import (
	"context"
	"crypto/rand"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/ratelimitd/ratelimitd/internal/fielderr"
	"github.com/ratelimitd/ratelimitd/internal/lease"
	"github.com/ratelimitd/ratelimitd/internal/limit"
)

// Home is the store grants are drawn from (redisstore.Store on the home
// Redis).
type Home interface {
	// GrantWithin takes and gives back grants within ctx's deadline.
	GrantWithin(ctx context.Context, ops []limit.GrantOp) ([]limit.GrantResult, error)
}

// Local is the region's store: it decides everything but the global
// checks, and a global check's partition share.
type Local interface {
	Evaluate(ctx context.Context, checks []limit.Check) ([]limit.Result, error)
}

// Policy is what answers a global check once what is held is spent and
// the home cannot be reached.
type Policy uint8

// The partition policies.
const (
	// Deny refuses: no region admits more than it was granted.
	Deny Policy = iota
	// Share decides the check in the region's own store against
	// Options.Share of the limit, per window.
	Share
)

// Options configures a [Store].
type Options struct {
	// Refresh is how often grants are topped up, and how long what is
	// held should last at the demand seen (with the home's round trip);
	// zero means DefaultRefresh.
	Refresh time.Duration
	// HomeTimeout bounds a call to the home; zero means
	// DefaultHomeTimeout.
	HomeTimeout time.Duration
	// OutAfter is how long calls to the home must keep failing before it
	// counts as out and Policy answers; zero means 2 × HomeTimeout.
	OutAfter time.Duration
	// ColdMargin is how much longer than twice the home's round trip a
	// request that found too little held waits for a draw made on its
	// behalf; zero means DefaultColdMargin.
	ColdMargin time.Duration
	// Policy and Share: the partition policy.
	Policy Policy
	Share  float64
	// Metrics receives the counts; nil records nothing.
	Metrics *Metrics
	// Logger says when the home goes out and comes back; nil discards.
	Logger *slog.Logger
	// Now is the clock of grants (a test's); nil means time.Now.
	Now func() time.Time
}

// Defaults of [Options].
const (
	DefaultRefresh     = 250 * time.Millisecond
	DefaultHomeTimeout = 2 * time.Second
	// DefaultColdMargin covers, beyond the draw's round trip, a second
	// one (a call that had to open a connection first: a handshake and
	// HELLO), the drawer's turn and the draw's own work.
	DefaultColdMargin = 50 * time.Millisecond
)

// homeConns is how many connections to the home a store readies at
// start (Warm): the cold drawer's calls and the refiller's, made at once;
// a call that must dial first waits two round trips, not one.
const homeConns = maxColdCalls + 2

// Validate refuses options no store can run with.
func (o Options) Validate() error {
	switch {
	case o.Refresh < 0 || o.Refresh > time.Minute:
		return fielderr.Errorf("global", "Refresh", "%v: want from 1ms to 1m", o.Refresh)
	case o.Policy == Share && (o.Share <= 0 || o.Share > 1):
		return fielderr.Errorf("global", "Share", "%v: want a share above 0 and at most 1", o.Share)
	case o.Policy > Share:
		return fielderr.Errorf("global", "Policy", "%d: want deny or share", o.Policy)
	}
	return nil
}

// Store decides global checks from grants and the rest in Local. It is
// safe for concurrent use.
type Store struct {
	local Local
	home  Home
	opts  Options
	// id names this store's settles at the home (their marks).
	id  string
	now func() time.Time
	log *slog.Logger
	m   *Metrics

	mu      sync.Mutex
	entries map[string]*entry
	// failingSince is when calls to the home began failing (zero while
	// they succeed); out says the home counts as out.
	failingSince time.Time
	out          bool
	rtt          time.Duration // the home's round trip, smoothed
	nextEnd      time.Time     // the earliest a held grant stops being valid
	// coldQ are the counters requests wait on a draw for (coldRun);
	// coldCalls, the cold drawer's calls under way.
	coldQ     []*entry
	coldCalls int

	wake     chan struct{}
	coldWake chan struct{}
	stop     chan struct{}
	wg       sync.WaitGroup
	once     sync.Once
}

// New wraps local with global limits drawn from home and starts the
// refiller, until Close.
func New(local Local, home Home, opts Options) *Store {
	if opts.Refresh == 0 {
		opts.Refresh = DefaultRefresh
	}
	if opts.HomeTimeout == 0 {
		opts.HomeTimeout = DefaultHomeTimeout
	}
	if opts.OutAfter == 0 {
		opts.OutAfter = 2 * opts.HomeTimeout
	}
	if opts.ColdMargin == 0 {
		opts.ColdMargin = DefaultColdMargin
	}
	s := &Store{local: local, home: home, opts: opts, id: rand.Text(), now: opts.Now, log: opts.Logger, m: opts.Metrics,
		entries: map[string]*entry{}, wake: make(chan struct{}, 1), coldWake: make(chan struct{}, 1), stop: make(chan struct{})}
	if s.now == nil {
		s.now = time.Now
	}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	if w, ok := home.(interface {
		Warm(context.Context, int) error
	}); ok {
		// The first calls made together (a burst of new keys) find
		// connections ready, not a handshake more to wait.
		s.wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), opts.HomeTimeout)
			defer cancel()
			_ = w.Warm(ctx, homeConns)
		})
	}
	s.wg.Go(s.run)
	s.wg.Go(s.coldRun)
	return s
}

// KeepCharges takes the usage charges among checks whose caller had no
// time left to ask (service.ChargeKeeper): a global budget's are spent
// here as any (they never wait on a store), the others are Local's to
// keep, when it keeps charges.
func (s *Store) KeepCharges(checks []limit.Check) bool {
	kept := false
	rest := make([]limit.Check, 0, len(checks))
	s.mu.Lock()
	now := s.now()
	for i := range checks {
		c := &checks[i]
		switch {
		case !c.Global:
			rest = append(rest, *c)
		case c.Usage && c.Charge() && c.Hits > 0:
			if e := s.entry(c, now); e != nil {
				s.spend(e, c.SaturatedHits(), now)
				kept = true
			} else {
				s.m.hits("abandoned", c.SaturatedHits())
			}
		}
	}
	s.mu.Unlock()
	k, ok := s.local.(interface{ KeepCharges([]limit.Check) bool })
	return ok && len(rest) > 0 && k.KeepCharges(rest) || kept
}

// Counters returns how many global counters the store holds state of
// (grants, demand, debts, flights): each costs a few hundred bytes until
// it goes unasked for 5 s and is forgotten.
func (s *Store) Counters() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.entries)
}

// Grant is Local's, when it grants (RLQS takes its grants there).
func (s *Store) Grant(ctx context.Context, ops []limit.GrantOp) ([]limit.GrantResult, error) {
	g, ok := s.local.(interface {
		Grant(context.Context, []limit.GrantOp) ([]limit.GrantResult, error)
	})
	if !ok {
		return nil, fmt.Errorf("global: %T cannot grant", s.local)
	}
	return g.Grant(ctx, ops)
}

// Close stops the refiller and gives back what is held, once. It does
// not close Local or Home.
func (s *Store) Close() error {
	s.once.Do(func() {
		close(s.stop)
		s.wg.Wait()
		s.pass(true)
	})
	return nil
}

// maxEntries bounds the counters a store holds grants of: beyond it a
// global check is refused (deciding it elsewhere would break the bound).
const maxEntries = 100_000

// margin is how long before its window ends, on this clock, a grant stops
// being used: the drift between this clock and the home's over a window.
const margin = 2 * time.Millisecond

// entry is what the store holds of one global counter.
type entry struct {
	check     limit.Check // the counter; Hits unused
	avail     uint64      // hits held, not yet used
	used      uint64      // hits of the held grants used: what a refund may give back
	gen       uint64      // changes when the held hits are replaced
	validTill time.Time   // the held hits are not used from then on
	windowEnd int64       // on the home's clock: what a give-back names
	remaining uint64      // the home counter's remaining, last heard
	// heardEnd and heardReset: the window and time to its end of the
	// latest run of the answers remaining was taken from (latest).
	heardEnd   int64
	heardReset int64
	resetAt    time.Time // when the window ends, on this clock
	dryUntil   time.Time // nothing to draw until then

	lease.Meter // the hits asked (charged, on a budget), and their smoothed rate
	lastUse     time.Time
	// inFlight counts e's ops in calls under way; asking, the hits their
	// draws asked for (a cold draw asks only for what they do not).
	inFlight int
	asking   uint64
	// waiting is the hits of requests waiting for a draw (coldWait),
	// drawn when the next draw closes drawn; queued: in the cold
	// drawer's queue.
	waiting uint64
	drawn   chan struct{}
	queued  bool

	// A budget's (a usage rule's): usage says the counter takes charges
	// or budget checks, so what the home has left is read every refresh
	// even when nothing is drawn; heard is when the home last answered.
	usage bool
	heard time.Time
	// debts are the charges beyond what was held, owed to the home by
	// window, oldest first; settling is the one sent (or to resend, with
	// the same seq, until it lands: settles are counted once per seq).
	debts    []debt
	settling *debt
	seq      uint64
	// flights are the budget checks admitted here whose streams have not
	// ended, oldest first: each holds its share of the grant until a
	// charge (or zero charge) ends it, or --usage-timeout. perCheck is a
	// stream's charge, averaged over the last limit.AvgCharges seen here
	// (charges counts them, up to that).
	flights  []flight
	perCheck float64
	varCheck float64
	charges  float64
}

// left is what the home counter had left when last heard (its limit
// once that window has ended), less what is owed to it.
func (e *entry) left(now time.Time) uint64 {
	r := e.remaining
	if !now.Before(e.resetAt) {
		r = e.check.Limit
	}
	return r - min(r, e.owed())
}

// windowEndAfter is when the window in force at now ends, on this
// clock: as the home last said (in its tail, when it may not have ended
// at the home yet, that end), or, not heard in it yet, as this clock
// reckons.
func (e *entry) windowEndAfter(now time.Time) time.Time {
	if e.resetAt.Add(afterEnd).After(now) {
		return e.resetAt
	}
	us := now.UnixMicro()
	return now.Add(time.Duration(limit.WindowEnd(us, e.check.WindowUS)-us) * time.Microsecond)
}

// chargeWindow is the end, on the home's clock, of the window a charge
// made now falls in: the window last heard of, or one after it (0 when
// none was heard of yet).
func (e *entry) chargeWindow(now time.Time) int64 {
	switch {
	case e.windowEnd == 0:
		return 0
	case now.Before(e.resetAt):
		return e.windowEnd
	}
	w := e.check.WindowUS
	return e.windowEnd + (now.Sub(e.resetAt).Microseconds()/w+1)*w
}

// kick wakes the refiller.
func (s *Store) kick() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}
