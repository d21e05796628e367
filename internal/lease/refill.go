package lease

import (
	"context"
	"time"

	"github.com/ratelimitd/ratelimitd/internal/limit"
)

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
	if len(ops) > 0 && !all && l.b.BreakerOpen() {
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
	ctx, cancel := context.WithTimeout(context.Background(), max(l.timeout, 2*l.interval))
	out, err := l.b.GrantWithin(ctx, ops)
	cancel()
	l.m.LeaseRefill(err == nil)
	l.mu.Lock()
	defer l.mu.Unlock()
	for i, g := range gs {
		g.inFlight = false
		switch {
		case err != nil:
			if ops[i].GiveBack {
				// The call may have run with its answer lost (a timeout
				// on a starved machine): held again, the hits would be
				// back in Redis as well and admitted twice.
				l.m.LeaseLost(ops[i].Check.Hits)
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
func (l *leases) passOps(now time.Time, idleAfter time.Duration, all bool) (ops []limit.GrantOp, gs []*grant) {
	for k, g := range l.entries {
		if g.inFlight {
			continue
		}
		g.Measure(now, l.interval/4)
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
			ops = append(ops, limit.GrantOp{Check: g.check.WithHits(g.avail), GiveBack: true, WindowEndUS: g.windowEnd})
			gs = append(gs, g)
			g.avail, g.used, g.inFlight = 0, 0, true
			g.gen++
		case all:
		case idle:
			delete(l.entries, k)
		default:
			want := GrantSize(g.Rate, l.interval, g.remaining)
			// A rate too low to fill a grant of two: decided exactly, as
			// without a lease. Otherwise hold between one and two grants,
			// so a stall shorter than the interval finds hits in hand.
			if want < 2 || g.avail >= want || now.Before(g.dryUntil) {
				continue
			}
			ops = append(ops, limit.GrantOp{Check: g.check.WithHits(want)})
			gs = append(gs, g)
			g.inFlight = true
		}
	}
	return ops, gs
}

// granted takes a grant's answer in: the hits held, until when they
// may be used (on this clock, counted from start, when the call was
// sent), and what the counter has left. Called with mu held.
func (l *leases) granted(g *grant, r limit.GrantResult, start time.Time) {
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
	el := now.Sub(g.From)
	return el >= l.interval/4 && float64(g.Asked)*float64(l.interval) >= 2*float64(el)
}
