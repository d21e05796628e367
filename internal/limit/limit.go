package limit

// Check is one counter of a request, as the service asks a store to decide it.
type Check struct {
	// Key is the counter's store key, from [Encoder].
	Key string
	// Limit is the number of hits allowed per window.
	Limit uint64
	// WindowUS is the window length in microseconds; windows are aligned
	// to multiples of it on the store's clock.
	WindowUS int64
	// Hits is what this request adds (or gives back, with Refund). Zero
	// checks the counter without consuming.
	Hits uint64
	// Refund gives Hits back (never below zero) instead of consuming them.
	// A refund is never rejected and never rejects the request.
	Refund bool
	// NoVeto marks a shadow-mode counter: it is decided and reported, but
	// being over its limit does not stop the request's other counters from
	// consuming.
	NoVeto bool
}

// Result is a store's decision on one [Check].
type Result struct {
	// Over reports that the check's own limit would be exceeded by its hits.
	Over bool
	// Count is the counter's value after the decision.
	Count uint64
	// ResetUS is the time until the window ends, in microseconds.
	ResetUS int64
}

// Remaining is the number of hits left in the window after the decision.
func (r Result) Remaining(limit uint64) uint64 {
	if r.Count >= limit {
		return 0
	}
	return limit - r.Count
}

// WindowEnd returns the end of the fixed window holding nowUS.
func WindowEnd(nowUS, windowUS int64) int64 {
	return nowUS - nowUS%windowUS + windowUS
}

// Apply decides one request's checks, all or nothing, given each counter's
// count in the current window, and updates counts in place.
//
// A consuming check is over when count+hits > limit. If any over check
// does not have NoVeto, the request is rejected and no counter consumes.
// Otherwise every check that is not itself over consumes its hits. Refunds
// always apply and never go below zero. It reports whether the request was
// admitted.
func Apply(checks []Check, counts []uint64, results []Result) bool {
	admitted := true
	for i, c := range checks {
		over := !c.Refund && counts[i]+c.Hits > c.Limit
		results[i].Over = over
		if over && !c.NoVeto {
			admitted = false
		}
	}
	for i, c := range checks {
		switch {
		case c.Refund:
			if counts[i] > c.Hits {
				counts[i] -= c.Hits
			} else {
				counts[i] = 0
			}
		case admitted && !results[i].Over:
			counts[i] += c.Hits
		}
		results[i].Count = counts[i]
	}
	return admitted
}
