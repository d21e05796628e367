package limit

// report returns the remaining hits, the reset and the expiry of a state.
func report(c *Check, st *State, now int64) (remaining uint64, resetUS, expireAt int64) {
	switch c.Algorithm {
	case SlidingWindow:
		est := estimate(c, st, now)
		if est < c.Limit {
			remaining = c.Limit - est
		}
		if st.Count > 0 || st.Prev > 0 {
			// The count is needed through the next window, as its Prev.
			expireAt = st.End + c.WindowUS + GraceUS
		}
		return remaining, st.End - now, expireAt
	case TokenBucket:
		if c.Limit == 0 {
			return 0, c.WindowUS, 0
		}
		t := interval(c)
		room := capacity(c, t) - (st.TAT - now)
		if room > 0 {
			remaining = uint64(room / t)
		}
		if remaining == 0 {
			resetUS = st.TAT + t - capacity(c, t) - now
		}
		if st.TAT > now {
			expireAt = st.TAT + GraceUS
		}
		return remaining, max(resetUS, 0), expireAt
	default:
		if st.Count < c.Limit {
			remaining = c.Limit - st.Count
		}
		// Flights never stretch the key past its window: a check in
		// flight at the window's end is kept only where the usage per
		// check is (below).
		if st.Count > 0 || len(st.Flights) > 0 {
			expireAt = st.End + GraceUS
		}
		if st.Charges > 0 || st.Peek {
			// The usage per check serves the next window's first checks,
			// and a peek mark its peeks.
			expireAt = max(expireAt, st.End+c.WindowUS+GraceUS)
		}
		return remaining, st.End - now, expireAt
	}
}

// estimate is the sliding window's count: the current window's plus the
// previous one's weighted by the share of it the sliding window still
// covers, in parts per million, all in exact integers.
func estimate(c *Check, st *State, now int64) uint64 {
	left := st.End - now // µs of the current window still to come: the previous window's share
	ppm := left / (c.WindowUS / 1_000_000)
	return st.Count + st.Prev*uint64(ppm)/1_000_000
}

// interval is a token bucket's emission interval: the window over the
// rate, rounded up so the rate is never exceeded.
func interval(c *Check) int64 {
	return (c.WindowUS + int64(c.Limit) - 1) / int64(c.Limit)
}

// capacity is the bucket's size in µs of arrivals: Burst intervals.
func capacity(c *Check, t int64) int64 {
	b := c.Burst
	if b == 0 {
		b = c.Limit
	}
	return int64(b) * t
}

// String names the algorithm as rules files do.
