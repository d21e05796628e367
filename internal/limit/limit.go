package limit

import (
	"errors"
	"fmt"
	"time"
)

// ErrChargesKept is wrapped in a store's error when the usage charges of
// the call it failed are kept by its charge journal, to be applied once
// the store answers (redisstore's journal.go): not lost.
var ErrChargesKept = errors.New("usage charges kept to apply when the store answers")

// Algorithm is how a counter decides.
type Algorithm uint8

// The algorithms. Their numbers travel to the Lua script; keep them.
const (
	// FixedWindow counts hits in windows aligned to multiples of the
	// window length on the store's clock.
	FixedWindow Algorithm = 0
	// SlidingWindow estimates the hits of the last window length: the
	// current window's count plus the previous window's count weighted by
	// the share of it still inside the sliding window.
	SlidingWindow Algorithm = 1
	// TokenBucket is GCRA: Limit per window is the rate, Burst the
	// capacity; the state is one theoretical arrival time.
	TokenBucket Algorithm = 2
)

// Check is one counter of a request, as the service asks a store to decide it.
type Check struct {
	// Key is the counter's store key, from [Encoder].
	Key string
	// Limit is the number of hits allowed per window (the rate, for a
	// token bucket).
	Limit uint64
	// WindowUS is the window length in microseconds.
	WindowUS int64
	// Hits is what this request adds (or gives back, with Refund). Zero
	// checks the counter without consuming. Stores decide on
	// min(Hits, MaxHits): see [MaxHits].
	Hits uint64
	// Refund gives Hits back (never below zero) instead of consuming them.
	// A refund is never rejected and never rejects the request.
	Refund bool
	// NoVeto marks a shadow-mode counter: it is decided and reported, but
	// being over its limit does not stop the request's other counters from
	// consuming.
	NoVeto bool
	// Algorithm decides the counter; the zero value is FixedWindow.
	Algorithm Algorithm
	// Burst is a token bucket's capacity; zero means Limit.
	Burst uint64
	// Lease lets a store decide the check in process from hits leased
	// from the counter (see internal/lease); a store without leases
	// decides it as any other.
	Lease bool
	// Global lets a store decide the check in process from grants drawn
	// from the home store, one limit across regions (see
	// internal/global); a store without one decides it as any other.
	Global bool
	// Usage marks a call on a rule that takes usage after the fact
	// (rejected_hits: usage); Kind says which call it is. A charge's hits
	// are recorded even when they cross the limit or the request is
	// refused, so usage that arrives after the fact is never lost. A
	// budget check is over when nothing is left, and on a fixed window
	// also when the checks admitted and not yet charged (in flight)
	// would, at the counter's usage per check, spend what is left.
	Usage bool
	// Kind refines a usage call; the zero value decides by the hits.
	Kind UsageKind
	// FlightS is the longest an admitted budget check counts as in
	// flight while its charge has not come, in whole seconds
	// (--usage-timeout): the ceiling of the horizon learned from how long
	// streams last (see [State.DurMS]).
	FlightS int64
	// Incumbent is envoyproxy/ratelimit's key of this counter without
	// its window start (<CACHE_KEY_PREFIX><domain>_<k1>_<v1>_..._), set
	// on fixed windows under --carry-incumbent-counts: a store that can
	// starts the counter from the incumbent's count the first time it
	// writes it in a window. Empty: nothing to carry.
	Incumbent string
	// PairID is the request's id on a fixed window's usage call (a rule's
	// request_id level, Envoy's x-request-id): the store keeps when that
	// request's call was admitted under it (State.PairMS), so that its
	// next call, the stream end, is known as one whatever its hits, ends
	// the check's own flight and teaches the stream's exact duration.
	// Empty: no pairing.
	PairID string
	// MarkKey and MarkOff make a usage charge count once however often it
	// is sent: a store that keeps marks records the charge only if bit
	// MarkOff of MarkKey is not set, and sets it (redisstore's charge
	// journal resends and re-applies charges so). Empty: no mark.
	MarkKey string
	MarkOff uint64
	// Calendar makes a fixed window a calendar period: the UTC month or
	// year holding now. WindowUS is then the longest such period
	// (CalendarMonthUS or CalendarYearUS), for keys and TTLs.
	Calendar Calendar
}

// Calendar is a fixed window's calendar period, if any.
type Calendar uint8

// The calendar periods. Their numbers travel to the Lua script; keep them.
const (
	NoCalendar    Calendar = 0
	CalendarMonth Calendar = 1
	CalendarYear  Calendar = 2
)

// The longest calendar periods, in µs: a calendar rule's WindowUS.
const (
	CalendarMonthUS = 31 * 24 * 3600 * 1_000_000
	CalendarYearUS  = 366 * 24 * 3600 * 1_000_000
)

// UsageKind is which call a usage call is. Its numbers travel to the
// Lua script; keep them.
type UsageKind uint8

// The kinds of usage call. A counter is a budget only once it is one:
// until a charge has been recorded on it (State.Charges), every call on
// it but a charge is a plain request (docs/token-budgets.md, "What each
// call does").
const (
	// ByHits: hits make a charge (a stream-end call that states its
	// usage); zero hits a budget check on a budget, the cold start's
	// check on a counter never charged nor counted (see [State.Peek]),
	// and otherwise a read (a peek: consumes nothing, over only past the
	// limit).
	ByHits UsageKind = 0
	// ZeroCharge is a stream end that charged nothing (a token kind the
	// stream did not use): it ends a flight and tells the usage per check
	// that a stream spent 0.
	ZeroCharge UsageKind = 1
	// CostCheck is a request-phase call that costs its hits (a stated 1,
	// or no hits stated): a budget check that also consumes its hits,
	// all or nothing, where the counter is a budget; a plain request
	// elsewhere.
	CostCheck UsageKind = 2
	// PlainCharge is a charge that is never a budget's (--budgets off):
	// its hits are recorded whatever the decision, as a charge's, and it
	// neither ends a flight nor teaches anything.
	PlainCharge UsageKind = 3
)

// Charge reports a usage charge: hits recorded whatever the decision,
// ending a flight.
func (c *Check) Charge() bool {
	return c.Usage && !c.Refund && (c.Kind == ZeroCharge || (c.Kind == ByHits || c.Kind == PlainCharge) && c.Hits > 0)
}

// Window returns the start and end (µs) of the fixed window holding
// nowUS: aligned to multiples of WindowUS, or the calendar period.
func (c *Check) Window(nowUS int64) (start, end int64) {
	if c.Calendar == NoCalendar {
		end = WindowEnd(nowUS, c.WindowUS)
		return end - c.WindowUS, end
	}
	t := time.UnixMicro(nowUS).UTC()
	var s, e time.Time
	if c.Calendar == CalendarYear {
		s = time.Date(t.Year(), 1, 1, 0, 0, 0, 0, time.UTC)
		e = s.AddDate(1, 0, 0)
	} else {
		s = time.Date(t.Year(), t.Month(), 1, 0, 0, 0, 0, time.UTC)
		e = s.AddDate(0, 1, 0)
	}
	return s.UnixMicro(), e.UnixMicro()
}

// MaxLimit is the largest limit of a fixed window (a token budget of
// 2.25 quadrillion): with a count of at most MaxCount and hits of at most
// MaxHits, every sum the stores form stays below 2^53, exact in the Lua
// script's doubles. Sliding windows and token buckets keep limits below
// 2^32 (MaxSmallLimit): their arithmetic multiplies counts by times.
const MaxLimit = 1<<51 - 1

// MaxSmallLimit is the largest limit of a sliding window or token bucket.
const MaxSmallLimit = 1<<32 - 1

// MaxHits is where a check's hits saturate: over any limit, so clamping
// changes no decision, and it keeps every number a store handles exact.
// A refund of MaxHits empties any counter within its limit.
const MaxHits = 1 << 51

// SaturatedHits returns the hits a store decides c on: Hits, at most
// [MaxHits].
func (c *Check) SaturatedHits() uint64 { return min(c.Hits, MaxHits) }

// Subset returns copies of the checks at idx, each edited by edit when
// it is set: a request's checks for one store, one hash slot, or a
// refund.
func Subset(checks []Check, idx []int, edit func(*Check)) []Check {
	out := make([]Check, len(idx))
	for j, i := range idx {
		out[j] = checks[i]
		if edit != nil {
			edit(&out[j])
		}
	}
	return out
}

// Result is a store's decision on one [Check].
type Result struct {
	// Over reports that the check's own hits would exceed its limit.
	Over bool
	// Remaining is how many more hits the counter allows right now, after
	// the decision.
	Remaining uint64
	// ResetUS is, for windows, the time until the current window ends;
	// for a token bucket, the time until one more hit is allowed (0 when
	// one is allowed now).
	ResetUS int64
}

// Used returns how much of limit a window counter has used: limit less
// Remaining. (For a token bucket, the tokens missing from a full bucket of
// limit.)
func (r Result) Used(limit uint64) uint64 { return limit - min(limit, r.Remaining) }

// State is a counter's stored state.
type State struct {
	// End is the window end (µs) of FixedWindow and SlidingWindow.
	End int64
	// Count is the hits of the window ending at End.
	Count uint64
	// Prev is SlidingWindow's count of the window before End's.
	Prev uint64
	// TAT is TokenBucket's theoretical arrival time (µs).
	TAT int64
	// Avg is a fixed window's usage per admitted budget check, in
	// 1/AvgScale hits: the mean of the charges that followed one, the
	// last AvgCharges of them weighing most (a mean of all while fewer
	// came, then a moving average of weight 1/AvgCharges). It serves the
	// next window too.
	Avg uint64
	// Charges counts the charges in Avg, up to AvgCharges.
	Charges uint64
	// DurMS is how long a fixed window's streams last, learned from the
	// ages at which charges end flights (ms, 0 while unknown): a maximum
	// that decays by 1/32 a sample. Flights expire at twice it (see
	// [FlightMS]). It serves the next window as Avg does.
	DurMS int64
	// Flights are a fixed window's budget checks admitted and not yet
	// charged, oldest first, in buckets by admission time.
	Flights []Flight
	// Peek marks a fixed window never charged whose cold start ran out:
	// its first checks' horizon passed without a charge. A call stating
	// 0 on it is then a read (a peek), not a budget check, until a charge
	// makes it a budget. It serves the next window as Avg does.
	Peek bool
	// Costed marks a budget whose requests cost their hits (CostCheck:
	// QuotaPolicy's request phase, a stated 1): there a call stating 0
	// is a stream end that charged nothing (a zero charge: it ends a
	// flight), not a budget check. It serves the next window as Avg does.
	Costed bool
	// Ended counts the calls stating 0 read on a fixed window never
	// charged while it held a count: stream ends that charged nothing
	// (a failed upstream's), each ending one of the requests counted, so
	// the counter's first charge puts in flight only those still running
	// (see land). At most Count; it serves its window only.
	Ended uint64
	// PairMS is when the request named by the check's PairID was
	// admitted (Unix ms; 0: none known), and PairFlew whether its check
	// went in flight then. Stores keep them under the pair's own key (see
	// [PairExpireUS]) and fill them in whether or not the counter was
	// found.
	PairMS   int64
	PairFlew bool
}

// Flight is a bucket of in-flight budget checks: N of them, admitted
// from FirstMS to LastMS (Unix ms).
type Flight struct {
	FirstMS, LastMS int64
	N               uint64
}

// InFlight returns the number of in-flight budget checks of st.
func (st *State) InFlight() uint64 {
	var n uint64
	for _, f := range st.Flights {
		n += f.N
	}
	return n
}

// AvgScale is State.Avg's fixed point: a usage per check of a few hits
// still moves by charges of one hit.
const AvgScale = 1024

// AvgCharges is how many of the latest charges State.Avg follows. The
// estimate of what n checks in flight will charge errs by about n times
// the charges' spread over √(2·AvgCharges): 256 keeps that near 1 % of a
// budget that 256 streams share, and follows a change of usage within a
// few hundred streams.
const AvgCharges = 256

// MaxCount is where a fixed window's charged count saturates: usage
// charges add to a count past its limit, and it must stay exact in the
// script's doubles. Every limit is below it, so saturation changes no
// decision.
const MaxCount = 1 << 52

// MaxSlidingCount is MaxCount for a sliding window, whose previous count
// is multiplied by up to 10^6 (parts per million) and must stay below
// 2^53; sliding limits are at most MaxSmallLimit.
const MaxSlidingCount = 1 << 33

// MaxDebtUS bounds how far usage charges push a token bucket's arrival
// time past now (about 35 years): beyond, the bucket is empty for good.
const MaxDebtUS = 1 << 50

// WithHits is c with Hits n (a grant's take or give-back of n).
func (c Check) WithHits(n uint64) Check {
	c.Hits = n
	return c
}

// WindowEnd returns the end of the fixed window holding nowUS.
func WindowEnd(nowUS, windowUS int64) int64 {
	return nowUS - nowUS%windowUS + windowUS
}

// Grace is how long a key outlives the moment its state stops mattering.
// The state itself (window end, arrival time) decides, never the TTL, so
// the grace only keeps a key from expiring early on a clock that runs
// ahead of Redis's expiry clock (a test's scripted clock).
const GraceUS = 1_000_000

// Decide decides one request's checks at nowUS, all or nothing, from each
// counter's stored state (found[i] false: none). It updates states in
// place, fills results, and sets expire[i] to the absolute µs after which
// the new state is useless, or 0 when the key should be deleted. It
// reports whether the request was admitted: no check without NoVeto is
// over. Every store implements exactly this; redisstore's Lua mirrors it
// operation for operation, in integers.
func Decide(checks []Check, states []State, found []bool, nowUS int64, results []Result, expire []int64) bool {
	admitted := true
	for i := range checks {
		c := &checks[i]
		if !found[i] {
			states[i] = State{PairMS: states[i].PairMS, PairFlew: states[i].PairFlew}
		}
		states[i] = normalize(c, states[i], nowUS)
		results[i].Over = !c.Refund && over(c, &states[i], nowUS, c.SaturatedHits())
		if results[i].Over && !c.NoVeto {
			admitted = false
		}
	}
	for i := range checks {
		c := &checks[i]
		// A usage charge is recorded whatever the decision (a paired
		// stream end too); a budget check admitted goes in flight.
		consume := admitted && !results[i].Over && !c.Refund || c.Charge() || paired(c, &states[i]) || endsStream(c, &states[i])
		apply(c, &states[i], nowUS, consume)
		results[i].Remaining, results[i].ResetUS, expire[i] = report(c, &states[i], nowUS)
		if c.HeldByFlights(results[i]) {
			// Refused for its flights, not a spent budget: the real
			// remainder stands, and the retry is when a flight ends.
			results[i].ResetUS = retryUS(c, &states[i], nowUS)
		}
	}
	return admitted
}

// normalize brings a stored state to nowUS: counts of past windows move
// or drop, a token bucket's arrival time is at least now.
func normalize(c *Check, st State, now int64) State {
	switch c.Algorithm {
	case SlidingWindow:
		end := WindowEnd(now, c.WindowUS)
		switch st.End {
		case end:
		case end - c.WindowUS:
			st = State{End: end, Prev: st.Count}
		default:
			st = State{End: end}
		}
	case TokenBucket:
		st.TAT = max(st.TAT, now)
	default:
		start, end := c.Window(now)
		if st.End != end {
			// The usage per check serves the window after its own, no
			// later: the state decides that, not a key's TTL.
			avg, k, dur, peek, costed := st.Avg, st.Charges, st.DurMS, st.Peek, st.Costed
			if st.End != start {
				avg, k, dur, peek, costed = 0, 0, 0, false, false
			}
			st = State{End: end, Avg: avg, Charges: k, DurMS: dur, Flights: st.Flights, Peek: peek, Costed: costed, PairMS: st.PairMS, PairFlew: st.PairFlew}
		}
		expireFlights(c, &st, now)
		if st.PairMS > 0 && (c.PairID == "" || st.PairMS*1000+c.FlightS*1_000_000 < now) {
			st.PairMS, st.PairFlew = 0, false
		}
	}
	return st
}

// over reports whether hits more would exceed the limit; for a budget
// check (Usage, no hits), whether nothing is left for it.
func over(c *Check, st *State, now int64, hits uint64) bool {
	if c.budgeted() {
		switch role(c, st) {
		case budgetCheck:
			return budgetOver(c, st, hits)
		case budgetCharge:
			return st.Count+hits > c.Limit
		}
	} else if c.Usage && hits == 0 && c.Kind == ByHits {
		switch c.Algorithm {
		case SlidingWindow:
			return estimate(c, st, now) >= c.Limit
		case TokenBucket:
			return c.Limit == 0 || capacity(c, interval(c))-(st.TAT-now) < interval(c)
		}
	}
	switch c.Algorithm {
	case SlidingWindow:
		return estimate(c, st, now)+hits > c.Limit
	case TokenBucket:
		if c.Limit == 0 {
			return hits > 0
		}
		t := interval(c)
		room := capacity(c, t) - (st.TAT - now) // in µs of arrivals still allowed
		return hits > 0 && (room < 0 || hits > uint64(room)/uint64(t))
	default:
		return st.Count+hits > c.Limit
	}
}

func apply(c *Check, st *State, now int64, consume bool) {
	hits := c.SaturatedHits()
	switch c.Algorithm {
	case TokenBucket:
		if c.Limit == 0 {
			return
		}
		t := interval(c)
		switch {
		case c.Refund:
			// Never below now: a bucket holds at most Burst tokens.
			if hits >= uint64((st.TAT-now+t-1)/t) {
				st.TAT = now
			} else {
				st.TAT -= int64(hits) * t
			}
		case consume:
			// A usage charge past the bucket is debt, bounded.
			if hits > uint64((now+MaxDebtUS-st.TAT)/t) {
				st.TAT = max(st.TAT, now+MaxDebtUS)
			} else {
				st.TAT += int64(hits) * t
			}
		}
	default:
		applyWindow(c, st, now, consume, hits)
	}
}

func maxCount(a Algorithm) uint64 {
	if a == SlidingWindow {
		return MaxSlidingCount
	}
	return MaxCount
}

func (a Algorithm) String() string {
	switch a {
	case FixedWindow:
		return "fixed_window"
	case SlidingWindow:
		return "sliding_window"
	case TokenBucket:
		return "token_bucket"
	}
	return fmt.Sprintf("algorithm(%d)", uint8(a))
}
