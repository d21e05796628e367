// Package lease decides leased budgets in process: a Store wraps the
// Redis store, holds grants and decides the checks of rules with
// lease: true from them (store.go, refill.go); the sizing policy below,
// and a simulation that compares it with the usual ways of counting
// locally, are here too. A lease is a number of hits an instance takes from a counter's
// shared budget at once (a "grant"), atomically, never more than what
// remains, and then decides requests against in process. Because the
// grants of a window add up to at most the limit, a fleet deciding from
// grants never admits more than the limit, whatever its size, the skew
// of its traffic, or the clocks. GrantSize decides how much to ask
// for: enough to decide locally for about one lease interval, little
// enough that one instance cannot strand the budget the others need.
package lease

import (
	"math"
	"time"
)

// DefaultInterval is how long a grant should last at the instance's
// recent rate (--lease-interval).
const DefaultInterval = 100 * time.Millisecond

// FairShare is the share of what remains in a window that one grant may
// take: an instance cannot know how many others draw on the counter, so
// it never takes more than 1/FairShare of the rest, and grants shrink
// geometrically to single hits as the window's budget runs out (the tail
// of a window is decided exactly).
const FairShare = 8

// GrantSize returns how many hits to ask for, given the instance's recent
// rate on the counter (hits per second), the lease interval and what
// remains of the budget. Zero means none remains. One means deciding hit
// by hit, as a counter without a lease does: a cold key (a rate too low
// to fill a grant) costs what it costs today.
func GrantSize(rate float64, interval time.Duration, remaining uint64) uint64 {
	if remaining == 0 {
		return 0
	}
	want := uint64(math.Ceil(rate * interval.Seconds()))
	share := remaining / FairShare
	return max(1, min(want, share))
}
