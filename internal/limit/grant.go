package limit

// GrantOp is one take or give-back of lease hits on a counter, or one
// settled charge (see Grant, GiveBack, Settle and redisstore's
// grant.lua).
type GrantOp struct {
	// Check names the counter and its rule; Hits is how many to take or
	// give back.
	Check Check
	// GiveBack returns Hits unused hits of a grant taken in the window
	// ending at WindowEndUS (ignored for a token bucket).
	GiveBack    bool
	WindowEndUS int64
	// Settle records Hits of usage charged beyond what was held, in the
	// window ending at WindowEndUS (zero: unknown), whatever the count: a
	// fixed window's only (see [Settle]). Settler and Seq
	// make it land once: a store that keeps settle marks records, per
	// counter and window, the highest Seq of each Settler, and answers a
	// settle at or below it as done without counting it again (a retry
	// of a settle whose answer was lost). Seq grows by one per settle of
	// a Settler on a counter.
	Settle  bool
	Settler string
	Seq     uint64
}

// GrantResult is a GrantOp's outcome.
type GrantResult struct {
	// Hits is how many were taken (a take) or given back.
	Hits uint64
	// Remaining is what the counter has left after it.
	Remaining uint64
	// ResetUS is the time until the window ends (for a token bucket,
	// until one more hit is allowed).
	ResetUS int64
	// WindowEndUS is the end of the window, on the store's clock, that
	// the hits were taken in (0 for a token bucket): a give-back names it.
	WindowEndUS int64
}

// Report returns what a counter in state st has left at nowUS, the time
// until its window ends (for a token bucket: until one more hit), and
// when its state stops mattering (0: it can be dropped now).
func Report(c *Check, st *State, nowUS int64) (remaining uint64, resetUS, expireAt int64) {
	return report(c, st, nowUS)
}

// Grant takes up to n hits of c's counter at nowUS for a lease: as many
// as remain in the window (fixed and sliding window) or as the bucket
// holds (token bucket), never more, and consumes them now as n hits of a
// request would be. So the grants of a window, whoever holds them, add up
// to at most the limit. found says whether st holds a stored state. It
// returns the hits granted (0: none remain) and updates st in place.
func Grant(c *Check, st *State, found bool, nowUS int64, n uint64) uint64 {
	if !found {
		*st = State{}
	}
	*st = normalize(c, *st, nowUS)
	n = min(n, MaxHits)
	var g uint64
	switch c.Algorithm {
	case TokenBucket:
		if c.Limit == 0 {
			return 0
		}
		t := interval(c)
		if room := capacity(c, t) - (st.TAT - nowUS); room > 0 {
			g = min(n, uint64(room/t))
		}
		st.TAT += int64(g) * t
	case SlidingWindow:
		if est := estimate(c, st, nowUS); est < c.Limit {
			g = min(n, c.Limit-est)
		}
		st.Count += g
	default:
		if st.Count < c.Limit {
			g = min(n, c.Limit-st.Count)
		}
		st.Count += g
	}
	return g
}

// Settle adds k hits of usage charged elsewhere to c's fixed-window
// counter at nowUS, whatever the count (as a usage charge is recorded,
// saturating at MaxCount), and returns them; unless they were charged in
// a window that ended before the one before the current (windowEnd; 0:
// when unknown), whose spend no longer matters: it returns 0. Charges of
// the window just ended count in the current one, as charges that reach
// a store late do: the count of an ended window is gone.
func Settle(c *Check, st *State, found bool, nowUS, windowEnd int64, k uint64) uint64 {
	if !found {
		*st = State{}
	}
	*st = normalize(c, *st, nowUS)
	if windowEnd != 0 && windowEnd < st.End-c.WindowUS {
		return 0
	}
	k = min(k, MaxHits)
	st.Count = min(st.Count+k, MaxCount)
	return k
}

// GiveBack returns k unused hits of a grant to c's counter at nowUS (found
// says whether st holds a stored state) and returns how many went back.
// A window's hits go back only while the window the grant was taken in,
// ending at windowEnd, is current: in a later window they would lower a
// count they were never part of; and never more than its count. A bucket
// takes tokens back at any time, never past a full bucket (all k are
// reported given back).
func GiveBack(c *Check, st *State, found bool, nowUS, windowEnd int64, k uint64) uint64 {
	if !found {
		*st = State{}
	}
	*st = normalize(c, *st, nowUS)
	k = min(k, MaxHits)
	switch c.Algorithm {
	case TokenBucket:
		if c.Limit == 0 {
			return 0
		}
		t := interval(c)
		// k·t may pass int64: compare in intervals first.
		if k >= uint64((st.TAT-nowUS+t-1)/t) {
			st.TAT = nowUS
		} else {
			st.TAT -= int64(k) * t
		}
		return k
	default:
		if st.End != windowEnd {
			return 0
		}
		k = min(st.Count, k)
		st.Count -= k
		return k
	}
}
