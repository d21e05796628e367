package global

import (
	"cmp"
	"time"

	"github.com/ratelimitd/ratelimitd/internal/limit"
)

// maxColdCalls bounds the cold drawer's calls under way at once: beyond,
// the counters queued wait for one to end and go together in the next
// (a flood of new keys makes few large calls, not one per key: at most
// maxColdCalls a round trip; each waits two round trips at most). The
// store readies as many connections to the home (homeConns).
const maxColdCalls = 16

// coldRun draws, as soon as they are asked for, for the counters that
// requests wait on (awaitDraws): every counter queued goes in one call,
// sent at once beside the passes and the cold calls still under way (at
// most maxColdCalls, paced), so a request waits one round trip, until
// Close. A counter whose window is ending waits for the next to open.
func (s *Store) coldRun() {
	again := time.NewTimer(time.Hour)
	defer again.Stop()
	var sent time.Time // when the last cold call left
	for {
		select {
		case <-s.stop:
			return
		case <-s.coldWake:
		case <-again.C:
		}
		s.mu.Lock()
		if s.coldCalls >= maxColdCalls {
			s.mu.Unlock()
			continue // the next call to end wakes this loop
		}
		// Paced, a call each round trip / maxColdCalls at most: the
		// calls under way never fill every slot (a flood of requests
		// would then wait a round trip for one), and what comes in
		// between goes in one call.
		if gap := cmp.Or(s.rtt, s.opts.Refresh)/maxColdCalls - time.Since(sent); gap > 0 {
			s.mu.Unlock()
			again.Reset(gap)
			continue
		}
		ops, es, next := s.coldOps()
		if len(ops) > 0 {
			s.coldCalls++
		}
		s.mu.Unlock()
		if next > 0 {
			again.Reset(next)
		}
		if len(ops) > 0 {
			sent = time.Now()
			s.wg.Go(func() {
				s.send(ops, es, false)
				s.mu.Lock()
				s.coldCalls--
				queued := len(s.coldQ) > 0
				s.mu.Unlock()
				if queued {
					select {
					case s.coldWake <- struct{}{}:
					default:
					}
				}
			})
		}
	}
}

// coldOps takes the cold drawer's queue: the draws to make now for the
// counters queued (their settles first), and how long until the first of
// those left queued, their window ending, may draw. Called with mu held.
func (s *Store) coldOps() (ops []limit.GrantOp, es []*entry, next time.Duration) {
	now := s.now()
	lead := s.opts.Refresh + s.rtt
	later := s.coldQ[:0]
	for _, e := range s.coldQ {
		if e.inTail(now) {
			// A draw now would land in the window's last moments,
			// void: it leaves as the next window opens.
			later = append(later, e)
			if d := e.resetAt.Add(afterEnd).Sub(now); next == 0 || d < next {
				next = d
			}
			continue
		}
		e.queued = false
		if e.inFlight > 0 && e.waiting <= e.asking {
			continue // its draw under way will wake its waiters
		}
		// Beyond what the draws under way asked for: the demand
		// that came after they left.
		n := s.drawSize(e, now, lead)
		n -= min(n, e.asking)
		if n == 0 {
			if e.inFlight == 0 {
				e.wakeWaiters() // spent: nothing to wait for
			}
			continue
		}
		if e.inFlight == 0 {
			// What is owed is settled first, in the same call: the
			// home must not grant hits already charged here.
			for _, op := range s.settleOps(e, false) {
				ops, es = append(ops, op), append(es, e)
				e.inFlight++
			}
		}
		ops = append(ops, limit.GrantOp{Check: e.check.WithHits(n)})
		es = append(es, e)
		e.inFlight++
		e.asking += n
	}
	s.coldQ = later
	return ops, es, next
}

// wakeWaiters wakes the requests waiting for e's draw. Called with mu
// held.
func (e *entry) wakeWaiters() {
	if e.drawn != nil {
		close(e.drawn)
		e.drawn = nil
	}
}
