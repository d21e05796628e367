package service

// A request's checks: its scratch memory, and one check per counter.

import (
	"sync"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/ratelimitd/ratelimitd/internal/limit"
)

// scratch is a request's working memory that nothing keeps once it is
// answered: its items and check states, reused between requests. (The
// checks are not: a store may still hold them after a request gave up
// waiting.)
type scratch struct {
	items  []item
	states []checkState
}

var scratches = sync.Pool{New: func() any { return new(scratch) }}

func (sc *scratch) itemsFor(n int) []item {
	if cap(sc.items) < n {
		sc.items = make([]item, n)
	}
	sc.items = sc.items[:n]
	return sc.items
}

func (sc *scratch) statesFor(n int) []checkState {
	if cap(sc.states) < n {
		sc.states = make([]checkState, n)
	}
	sc.states = sc.states[:n]
	return sc.states
}

// release clears the scratch (its items point into the rules, which a
// reload may drop) and returns it to the pool.
func (sc *scratch) release() {
	clear(sc.items)
	clear(sc.states)
	scratches.Put(sc)
}

// encoders keeps key buffers between requests: a key then costs one
// allocation, its string.
var encoders = sync.Pool{New: func() any { return new(limit.Encoder) }}

// buildChecks gives every counted item a check. Items on one counter (the
// same descriptor twice, say) share one check holding their combined hits,
// so a store never sees a key twice in one evaluation.
func (s *Service) buildChecks(req *rlsv3.RateLimitRequest, items []item, sc *scratch) ([]limit.Check, []checkState) {
	enc := encoders.Get().(*limit.Encoder)
	defer encoders.Put(enc)
	checks := make([]limit.Check, 0, len(items))
	var consume, refund []uint64
	merged := false
	descs := req.GetDescriptors()
	for i := range items {
		it := &items[i]
		if it.kind != counted {
			continue
		}
		key := s.counterKey(enc, req.GetDomain(), descs[i].GetEntries(), it)
		c := indexKey(checks, key)
		if c < 0 {
			c = len(checks)
			checks = append(checks, s.newCheck(req.GetDomain(), descs[i].GetEntries(), it, key))
			consume, refund = append(consume, 0), append(refund, 0)
		} else {
			s.mergeCheck(&checks[c], it)
			merged = true
		}
		if it.refund {
			refund[c] += it.hits
		} else {
			consume[c] += it.hits
		}
		it.check = c
	}
	// Each item on a counter named again later learns the later ones'
	// hits, to be answered as the incumbent answers each occurrence in
	// turn (responder.decided); not where hits are also given back.
	if merged {
		later := make([]uint64, len(checks))
		for i := len(items) - 1; i >= 0; i-- {
			it := &items[i]
			if it.kind != counted || refund[it.check] > 0 {
				continue
			}
			it.after = later[it.check]
			later[it.check] += it.hits
		}
	}
	states := sc.statesFor(len(checks))
	for c := range checks {
		// The sums are exact (MaxDescriptors hits of at most 2^51-1 each);
		// the stores saturate them (limit.MaxHits), which decides the same.
		if consume[c] >= refund[c] {
			checks[c].Hits = consume[c] - refund[c]
		} else {
			checks[c].Hits, checks[c].Refund = refund[c]-consume[c], true
		}
	}
	return checks, states
}

// newCheck is the check of item it, the first on counter key; its hits
// are summed by the caller.
func (s *Service) newCheck(domain string, ents []*rlcommon.RateLimitDescriptor_Entry, it *item, key string) limit.Check {
	ch := limit.Check{Key: key, Limit: it.rpu, WindowUS: it.windowUS, NoVeto: it.shadow || it.quota,
		Algorithm: it.algo, Burst: it.burst, Lease: it.lease, Global: it.global, Usage: it.usage, Kind: it.ukind, Calendar: it.calendar, FlightS: s.flightS}
	if it.usage && it.algo == limit.FixedWindow {
		ch.PairID = it.pairID
	}
	if s.opts.CarryIncumbent && it.algo == limit.FixedWindow && it.calendar == limit.NoCalendar && it.mult <= 1 && !it.lease && !it.global {
		ch.Incumbent = s.incumbentKey(domain, ents, it)
	}
	return ch
}

// mergeCheck adds item it to ch, the check of its counter: the lower
// limit, a veto if either vetoes.
func (s *Service) mergeCheck(ch *limit.Check, it *item) {
	ch.Limit = min(ch.Limit, it.rpu)
	ch.NoVeto = ch.NoVeto && (it.shadow || it.quota)
	// A usage item is never leased, so the merged check is not either;
	// and usage on a counter is never dropped with the request's other
	// hits on it.
	ch.Lease = ch.Lease && it.lease
	ch.Global = ch.Global && it.global
	ch.Usage = ch.Usage || it.usage
	if ch.Kind != it.ukind {
		// Two kinds of call on one counter: the summed hits decide, a
		// charge when there are any (never a budget's under NoBudgets).
		ch.Kind = limit.ByHits
		if s.opts.NoBudgets {
			ch.Kind = limit.PlainCharge
		}
	}
}

// indexKey is the index of key's check among checks, -1 for none: a
// request holds a few, found faster by a scan than in a map.
func indexKey(checks []limit.Check, key string) int {
	for j := range checks {
		if checks[j].Key == key {
			return j
		}
	}
	return -1
}
