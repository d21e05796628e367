// Global budgets: what a budget check holds while its stream runs, and
// what is owed to the home when charges pass what was held.

package global

import (
	"math"
	"slices"
	"time"

	"github.com/ratelimitd/ratelimitd/internal/limit"
)

// flight is a budget check admitted at at, holding hits of the grant of
// generation gen, drawn in the window ending at end (the home's clock).
type flight struct {
	at   time.Time
	hits uint64
	gen  uint64
	end  int64
}

// estimate is a stream's charge as seen here, never more than maxHold.
// Zero until a charge is seen.
func (e *entry) estimate() uint64 {
	return min(uint64(math.Ceil(e.perCheck)), e.maxHold())
}

// maxHold is the most a budget check holds: an eighth of the limit (a
// draw takes at most a quarter of what remains: more could never be
// held).
func (e *entry) maxHold() uint64 {
	return max(1, e.check.Limit/8)
}

// hold is what a budget check holds while its stream runs: the
// estimate and half the charges' standard deviation (never more than
// maxHold). A charge beyond its hold is owed, paid by what
// later streams charge below theirs; held at the mean, what comes back
// below is spent on new streams at once while what goes beyond is owed,
// so an instance's debts drift up, and once the home has nothing left
// they are settled past the budget (1.04-1.07× its budget at 3×
// offered). Half a deviation above the mean, they are paid as they come.
func (e *entry) hold() uint64 {
	est := e.estimate()
	if est == 0 {
		return 0
	}
	return min(est+uint64(math.Sqrt(e.varCheck)/2), e.maxHold())
}

// pooledStreams is when a budget's rest is pooled at the home: once it
// covers fewer streams than this (at the estimate), each instance holds
// at most one stream's beyond its flights, and a check short of one
// waits for a draw of it, so that the last of a window is spent by
// whichever instance has the streams, not stranded in another's holds.
const pooledStreams = 8

// pooled reports that e is a budget whose rest, as last heard, is
// pooled at the home (pooledStreams).
func (e *entry) pooled(now time.Time) bool {
	est := e.estimate()
	return e.usage && est > 0 && e.left(now) < pooledStreams*est
}

// land ends the oldest flight at a charge of hits: what it held goes
// back to the grant (the charge is paid from it), and the charge teaches
// the usage per check. It returns what the flight held (0: none here).
func (e *entry) land(hits uint64, valid bool) uint64 {
	e.charges = min(e.charges+1, limit.AvgCharges)
	d := float64(hits) - e.perCheck
	e.perCheck += d / e.charges
	e.varCheck += (d*(float64(hits)-e.perCheck) - e.varCheck) / e.charges
	if len(e.flights) == 0 {
		return 0
	}
	f := e.flights[0]
	e.flights = e.flights[1:]
	if f.gen != e.gen || !valid {
		return 0
	}
	e.avail += f.hits
	return f.hits
}

// carry holds again, from the hits of the window in force, what the
// streams admitted in an earlier window and still running held there:
// their charges land in this window, and are paid from its hits, not
// from hits that newer streams were admitted on. A stream it cannot
// cover holds what is left. Called with mu held.
func (e *entry) carry() {
	for i := range e.flights {
		f := &e.flights[i]
		if f.end == e.windowEnd || e.windowEnd == 0 {
			continue
		}
		h := min(f.hits, e.avail)
		e.avail -= h
		e.used += h
		f.hits, f.gen, f.end = h, e.gen, e.windowEnd
	}
}

// carrying is what the streams admitted in an earlier window than the
// one in force at now and still running held there: what a draw asks
// for them.
func (e *entry) carrying(now time.Time) uint64 {
	ended := !now.Before(e.resetAt)
	var n uint64
	for _, f := range e.flights {
		if ended || f.end != e.windowEnd {
			n += f.hits
		}
	}
	return n
}

// expireFlights ends the flights older than timeout: their streams never
// charged (cancelled, or ended at another instance). Called with mu held.
func (e *entry) expireFlights(now time.Time, timeout time.Duration) {
	if e.charges == 0 && timeout >= 0 {
		// Streams admitted before any charge: held for what a region's
		// budget holds them while nothing is learned.
		timeout = min(timeout, limit.ColdFlightMS*time.Millisecond)
	}
	for len(e.flights) > 0 && now.Sub(e.flights[0].at) > timeout {
		if f := e.flights[0]; f.gen == e.gen && now.Before(e.validTill) {
			e.avail += f.hits
		}
		e.flights = e.flights[1:]
	}
}

// debt is usage charged beyond what was held, owed to the home: hits of
// the window ending at end on the home's clock (0: not known yet).
type debt struct {
	end  int64
	hits uint64
	seq  uint64
	at   time.Time // when it was first owed
}

// owe adds hits charged in the window ending at end to what is owed.
func (e *entry) owe(end int64, hits uint64, now time.Time) {
	if n := len(e.debts); n > 0 && e.debts[n-1].end == end {
		e.debts[n-1].hits += hits
		return
	}
	e.debts = append(e.debts, debt{end: end, hits: hits, at: now})
}

// repay pays the debts of the window in force not yet sent to the home
// from what is held, and returns what it paid. Called with mu held.
func (e *entry) repay() uint64 {
	var paid uint64
	for i := range e.debts {
		if d := &e.debts[i]; e.inForce(d) {
			k := min(e.avail, d.hits)
			e.avail -= k
			d.hits -= k
			paid += k
		}
	}
	e.debts = slices.DeleteFunc(e.debts, func(d debt) bool { return d.hits == 0 })
	return paid
}

// owedNow is the debts of the window in force not yet sent to the home.
func (e *entry) owedNow() uint64 {
	var n uint64
	for i := range e.debts {
		if d := &e.debts[i]; e.inForce(d) {
			n += d.hits
		}
	}
	return n
}

// inForce reports that d is a debt of the window in force, as last
// heard from the home.
func (e *entry) inForce(d *debt) bool {
	return d.end != 0 && d.end == e.windowEnd
}

// owed is what is owed to the home, settling or not.
func (e *entry) owed() uint64 {
	var n uint64
	for _, d := range e.debts {
		n += d.hits
	}
	if e.settling != nil {
		n += e.settling.hits
	}
	return n
}
