package limit

import "slices"

// A token budget on a fixed window keeps, beside its count, what it knows
// of the streams that spend it: the usage per check (Avg over Charges),
// how long streams last (DurMS) and the checks admitted whose charge has
// not come (Flights). A budget check is admitted while the count and the
// flights, each at the usage per check, leave something of the limit.
//
// What it can and cannot tell apart (docs/token-budgets.md says the
// same): Envoy's stream-end call carries nothing that pairs it with its
// check, so a charge ends the flight whose age is nearest the learned
// duration, not its own; a check whose charge never comes (a failed or
// cancelled stream) is a flight like any other until it is older than
// twice the longest recent stream, then it expires; a stream-end call of
// zero hits alone in its request cannot be told from a check (the service
// marks one as a ZeroCharge when another descriptor of its request
// charges).

// The budget's learned horizon. Their values travel to the Lua script
// too; keep them equal.
const (
	// MinFlightMS is the shortest horizon: twice a duration learned
	// below it still keeps flights this long (Envoy's own round trips).
	MinFlightMS = 250
	// ColdFlightMS is the horizon before any duration is learned (no
	// charge has ended a flight yet), at most Check.FlightS: short, since
	// a counter that is never charged (hits_addend 0 used as a peek) is
	// held by its flights for this long at a time.
	ColdFlightMS = 1000
	// SampleCharges is how many of a counter's first charges learn the
	// duration whatever the flights: later ones learn it only where at
	// most two checks are in flight, where the oldest flight is the
	// charge's own or its neighbour's (with more, the oldest may be a
	// check whose charge never came, and ages would only grow), or while
	// a first wave is still running (see [firstWave]).
	SampleCharges = 64
	// ColdInFlight is how many checks may be in flight before the first
	// charge tells the usage per check: until then each counts as a
	// quarter of the limit.
	ColdInFlight = 4
	// FlightBuckets is how many buckets the flights are kept in, about:
	// a bucket takes admissions for a sixteenth of the horizon.
	FlightBuckets = 16
)

// FlightMS returns how long a budget check admitted now stays in flight
// without a charge: twice the learned stream duration, at least
// MinFlightMS, ColdFlightMS while none is learned, and at most FlightS.
func FlightMS(c *Check, st *State) int64 {
	d := int64(ColdFlightMS)
	if st.DurMS > 0 {
		d = max(2*st.DurMS, MinFlightMS)
		if c.PairID != "" && st.Charges >= AvgCharges {
			// Paired: the duration is the longest stream's own, not a
			// guess, once enough streams have ended to have met the long
			// ones.
			d = max(st.DurMS+st.DurMS/4, MinFlightMS)
		}
	}
	return min(d, c.FlightS*1000)
}

// budgetRole is what a usage call on a fixed window does.
type budgetRole uint8

const (
	budgetNone   budgetRole = iota // a plain request
	budgetCheck                    // admitted while the budget covers the flights; joins them
	budgetCharge                   // recorded whatever; ends a flight
)

// role says what a usage call on a fixed window does. A counter is a
// budget once a charge has been recorded on it (Charges, carried to the
// next window): until then every call but a charge is a plain request,
// except a call stating 0 on a counter that holds no count, which is the
// cold start's budget check (a budget's first checks come before any
// charge) until that cold start runs out without a charge (Peek: it was
// a peek, and is a read from then on).
func role(c *Check, st *State) budgetRole {
	if paired(c, st) {
		return budgetCharge
	}
	switch c.Kind {
	case ZeroCharge:
		return budgetCharge
	case PlainCharge:
		return budgetNone
	case CostCheck:
		if st.Charges > 0 {
			return budgetCheck
		}
		return budgetNone
	}
	if c.Hits > 0 {
		return budgetCharge
	}
	if st.Charges > 0 && st.Costed {
		// A budget whose requests cost 1: a 0 is their stream's end.
		return budgetCharge
	}
	if st.Charges > 0 || st.Count == 0 && !st.Peek {
		return budgetCheck
	}
	return budgetNone
}

// endsStream reports a call stating 0 on a budget whose requests cost
// their hits (State.Costed): a stream end that charged nothing, recorded
// whatever the decision, as a charge is.
func endsStream(c *Check, st *State) bool {
	return c.budgeted() && c.Kind == ByHits && c.Hits == 0 && st.Charges > 0 && st.Costed
}

// readsEnd reports a call stating 0 read on a fixed window never charged
// that holds a count: a request's stream end that charged nothing
// (State.Ended).
func readsEnd(c *Check, st *State) bool {
	return c.Kind == ByHits && c.Hits == 0 && st.Charges == 0 && st.Count > 0
}

// paired reports a usage call whose request was admitted before: the
// request's stream end, a charge whatever its hits.
func paired(c *Check, st *State) bool {
	return c.PairID != "" && st.PairMS > 0 && c.budgeted()
}

// budgeted reports a call a budget may take: a usage call, not a
// refund, on a fixed window.
func (c *Check) budgeted() bool {
	return c.Usage && !c.Refund && c.Algorithm == FixedWindow
}

// landPaired takes a paired stream end's charge of hits: the stream's
// duration is exactly its age, and the flight it ends its own check's
// (if that went in flight and has not expired). A charge whose request is
// not known (its check was admitted more than FlightS ago, or never)
// ends nothing: every flight still held is another request's.
func landPaired(st *State, now int64, hits uint64) {
	if st.PairMS > 0 {
		age := max(now/1000-st.PairMS, 1)
		st.DurMS = max(age, st.DurMS-st.DurMS/32)
		if st.PairFlew {
			st.Flights = endAt(st.Flights, st.PairMS)
		}
	}
	st.PairMS, st.PairFlew = 0, false
	learnUsage(st, hits)
}

// endAt ends one flight of the bucket holding checks admitted at ms, if
// any is left. The slice may be shared with a stored state.
func endAt(fl []Flight, ms int64) []Flight {
	for i, f := range fl {
		if f.FirstMS <= ms && ms <= f.LastMS {
			out := slices.Clone(fl)
			if out[i].N > 1 {
				out[i].N--
				return out
			}
			out = slices.Delete(out, i, i+1)
			if len(out) == 0 {
				out = nil
			}
			return out
		}
	}
	return fl
}

// budgetOver reports whether a budget check of hits (its cost) is over:
// the budget is spent, the cost does not fit, or the flights, each at
// the usage per check (a quarter of the limit before any charge), leave
// nothing. The check itself is not counted: after one large charge the
// rest of a budget stays usable, at the price of one stream's usage past
// the estimate. In floats, as the script: past 2^53 it is over by far.
func budgetOver(c *Check, st *State, hits uint64) bool {
	if st.Count >= c.Limit || st.Count+hits > c.Limit {
		return true
	}
	n := st.InFlight()
	if n == 0 {
		return false
	}
	if st.Charges == 0 {
		return float64(st.Count)+float64(n)*float64(c.Limit*(AvgScale/ColdInFlight))/AvgScale >= float64(c.Limit)
	}
	// The usage per check of k charges is widened by (k+3)/(k+1): twice
	// the first charge, 1.4 times the mean of four, 3 % more at 64. A
	// mean of a few charges errs by far (the shortest streams charge
	// first), and a budget must not open to every stream on one sample.
	k := float64(st.Charges)
	return float64(st.Count)+float64(n)*float64(st.Avg)*(k+3)/(k+1)/AvgScale >= float64(c.Limit)
}

// expireFlights drops the flights older than the horizon: a bucket goes
// once its last admission is more than FlightMS old (never early). The
// slice may be shared with a stored state, so it is never written in
// place.
func expireFlights(c *Check, st *State, now int64) {
	nowMS, d := now/1000, FlightMS(c, st)
	k := 0
	for k < len(st.Flights) && st.Flights[k].LastMS+d < nowMS {
		k++
	}
	if k > 0 {
		st.Flights = st.Flights[k:]
		if st.Charges == 0 {
			// The cold start ran out without a charge: a peek.
			st.Peek = true
		}
	}
	if len(st.Flights) == 0 {
		st.Flights = nil
	}
}

// fly puts an admitted budget check in flight: into the newest bucket
// while it is younger than a sixteenth of the horizon, else a new one.
func fly(c *Check, st *State, now int64) {
	nowMS := now / 1000
	g := max(FlightMS(c, st)/FlightBuckets, 1)
	n := len(st.Flights)
	fl := make([]Flight, n, n+1)
	copy(fl, st.Flights)
	if n > 0 && nowMS-fl[n-1].FirstMS < g {
		fl[n-1].LastMS, fl[n-1].N = nowMS, fl[n-1].N+1
	} else {
		fl = append(fl, Flight{FirstMS: nowMS, LastMS: nowMS, N: 1})
	}
	st.Flights = fl
}

// applyWindow is apply on a fixed or sliding window: the count moves by
// hits (consumed or given back) and a usage call acts on the budget's
// state by the role it was decided on.
func applyWindow(c *Check, st *State, now int64, consume bool, hits uint64) {
	// The role is the one decided on: before the count moves.
	rl := budgetNone
	if c.budgeted() {
		rl = role(c, st)
	}
	if rl == budgetCheck && c.Kind == CostCheck {
		// Judged, admitted or not, so that a request refused elsewhere
		// marks it as one call would, on every topology.
		st.Costed = true
	}
	switch {
	case c.Refund:
		if givesBackFlight(c, st) {
			// A budget check given back (another group refused its
			// request, EvaluateInOrder) leaves the flights it joined,
			// as if never admitted.
			st.Flights = unfly(st.Flights)
		}
		st.Count -= min(st.Count, hits)
	case consume:
		st.Count = min(st.Count+hits, maxCount(c.Algorithm))
	}
	if !consume || !c.budgeted() {
		return
	}
	switch {
	case rl == budgetCharge && c.PairID != "":
		landPaired(st, now, hits)
		return
	case rl == budgetCharge:
		land(st, now, hits)
		return
	case rl == budgetCheck:
		fly(c, st, now)
	case readsEnd(c, st):
		st.Ended = min(st.Ended+1, st.Count)
	}
	if c.PairID != "" {
		// The request's first call, admitted: its next is its end.
		st.PairMS, st.PairFlew = now/1000, rl == budgetCheck
	}
}

// givesBackFlight reports a refund that gives back a budget check's
// flight: a call just admitted on the counter, given back because
// another group refused its request, flew if it was a budget check — a
// cost check on a budget, or a call stating 0 on a budget (not a costed
// one's: there it was a stream's end) or on a counter holding no count
// (see role).
func givesBackFlight(c *Check, st *State) bool {
	if !c.Refund || !c.Usage || c.Algorithm != FixedWindow || len(st.Flights) == 0 {
		return false
	}
	zero := c.Kind == ByHits && c.Hits == 0
	return st.Charges > 0 && (c.Kind == CostCheck || zero && !st.Costed) || st.Charges == 0 && zero && st.Count == 0
}

// unfly takes one check out of the newest bucket of flights fl, the one
// a check admitted a moment ago joined. The slice may be shared with a
// stored state.
func unfly(fl []Flight) []Flight {
	n := len(fl)
	if n == 0 {
		return fl
	}
	if fl[n-1].N > 1 {
		out := slices.Clone(fl)
		out[n-1].N--
		return out
	}
	if n == 1 {
		return nil
	}
	return fl[: n-1 : n-1]
}

// land takes a charge of hits (zero for a ZeroCharge): it learns the
// duration from the oldest flight's age while that age is trustworthy,
// ends the flight nearest the duration (the oldest while none is
// learned), and moves the usage per check toward hits. A charge that
// finds no flight still informs the usage. It does not lengthen the
// duration: its check may have expired (streams grew longer) or been
// lost (a flushed or failed-over key), and a duration grown on the
// second would keep every flight up to FlightS, the lock this design
// exists to end; streams that grow longer are learned where few are in
// flight, else the bound weakens (flights end early), never locks. The
// counter's first charge puts the requests it admitted before in flight.
func land(st *State, now int64, hits uint64) {
	nowMS := now / 1000
	if len(st.Flights) > 0 {
		n := st.InFlight()
		trusted := st.Charges < SampleCharges || n <= 2
		if trusted || firstWave(st, n) {
			age := max(nowMS-st.Flights[0].FirstMS, 1)
			if !trusted {
				// A first wave's sample raises it by 8/n at most: a wave
				// of n brings about n charges a duration, each a little
				// older than the last; a flood of n checks never charged,
				// sampled only as often as other streams charge, would
				// otherwise carry it with its age and never expire.
				age = min(age, st.DurMS+8*st.DurMS/int64(n))
			}
			st.DurMS = max(age, st.DurMS-st.DurMS/32)
		}
		j := 0
		if st.DurMS > 0 {
			// The bucket whose middle is nearest now - DurMS, in
			// integers: |first + last - 2 (now - dur)|; the older wins a
			// tie.
			target := 2 * (nowMS - st.DurMS)
			best := int64(-1)
			for i, f := range st.Flights {
				d := f.FirstMS + f.LastMS - target
				if d < 0 {
					d = -d
				}
				if best < 0 || d < best {
					j, best = i, d
				}
			}
		}
		fl := slices.Clone(st.Flights)
		if fl[j].N > 1 {
			fl[j].N--
		} else {
			fl = slices.Delete(fl, j, j+1)
		}
		if len(fl) == 0 {
			fl = nil
		}
		st.Flights = fl
	} else if st.Charges == 0 && st.Count > hits+1+st.Ended {
		// The counter's first charge, none in flight: the requests it
		// admitted as plain ones until now (a cost of 1 each:
		// QuotaPolicy's request phase) are streams still running, but
		// this one and those whose end was read charging 0 (Ended). In
		// flight from now, their charges end them instead of the checks
		// that follow (else 16 QuotaPolicy streams let through 1.20
		// times the budget).
		st.Flights = []Flight{{FirstMS: nowMS, LastMS: nowMS, N: st.Count - hits - 1 - st.Ended}}
	}
	st.Ended = 0
	learnUsage(st, hits)
}

// learnUsage moves the usage per check toward a charge of hits.
func learnUsage(st *State, hits uint64) {
	st.Charges = min(st.Charges+1, AvgCharges)
	h := hits * AvgScale
	if h >= st.Avg {
		st.Avg += (h - st.Avg) / st.Charges
	} else {
		st.Avg -= (st.Avg - h) / st.Charges
	}
}

// firstWave reports whether a counter's first wave of streams is still
// running at a charge, with n checks in flight: fewer charges have come
// than checks are in flight, though not so few that the flights could be
// a flood of checks never charged (at most four per charge), and the
// counter has not yet seen AvgCharges charges. Its first charges are its
// shortest streams, the only ones ended by then: a duration learned from
// them alone expired the longer streams' checks while they ran (256
// streams of 0.2-2 s let through 1.45 times the budget); the oldest
// flight's age keeps teaching it until the charges catch up, by 8/n of it
// at most a charge (land).
func firstWave(st *State, n uint64) bool {
	return st.Charges < AvgCharges && st.Charges < n && n <= 4*st.Charges
}

// HeldByFlights reports that a usage call's result r is a refusal for
// the checks in flight alone: over, though what is left covers its cost
// (anything else over leaves less than its hits, a spent budget none).
// Decide gives such a refusal retryUS's reset; the service tells its
// remainder.
func (c *Check) HeldByFlights(r Result) bool {
	return r.Over && c.Usage && !c.Refund && !c.Charge() && r.Remaining > 0 && r.Remaining >= c.SaturatedHits()
}

// retryUS is the reset a budget check refused for its flights reports
// instead of the window's end: until the oldest flight expires, when the
// budget holds one flight fewer (the window's end if sooner).
func retryUS(c *Check, st *State, now int64) int64 {
	if len(st.Flights) == 0 {
		return st.End - now
	}
	at := (st.Flights[0].LastMS + FlightMS(c, st) + 1) * 1000
	return max(min(at, st.End)-now, 0)
}

// PairExpireUS returns when a check's pair key, holding st's PairMS, is
// of no more use (µs), or 0 when it should be deleted: a request's end
// may come up to FlightS after its admission, and then still teaches
// the stream's duration.
func PairExpireUS(c *Check, st *State) int64 {
	if st.PairMS == 0 {
		return 0
	}
	return st.PairMS*1000 + c.FlightS*1_000_000 + GraceUS
}
