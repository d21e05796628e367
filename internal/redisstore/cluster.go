package redisstore

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/ratelimitd/ratelimitd/internal/limit"
)

// slotGroup is the indexes of one request's checks that share a slot.
type slotGroup struct {
	slot int
	idx  []int
}

// groupBySlot returns the checks' indexes per hash slot, in slot order.
func groupBySlot(checks []limit.Check) []slotGroup {
	var groups []slotGroup
	for i, c := range checks {
		sl := slot(c.Key)
		g := slices.IndexFunc(groups, func(g slotGroup) bool { return g.slot == sl })
		if g < 0 {
			g = len(groups)
			groups = append(groups, slotGroup{slot: sl})
		}
		groups[g].idx = append(groups[g].idx, i)
	}
	slices.SortFunc(groups, func(a, b slotGroup) int { return a.slot - b.slot })
	return groups
}

// evaluateGroups decides a request whose checks span several slots: one
// script call per slot, in ascending slot order, stopping at the first
// group that rejects. What the earlier groups consumed is then refunded
// and the later groups are only read, so a rejected request consumes
// nothing. The fixed order works like lock ordering: requests that
// contend for the same counters reach the later slots only if they passed
// the earlier ones, so N concurrent identical requests at a limit of 10
// admit exactly 10. (Sending the groups concurrently and refunding on
// reject admitted 0 to 3 of 10 under 200 concurrent requests: each
// request's transient consumption in one slot rejected others there.)
// Each group is all or nothing by itself. A refund can land in the next
// window when the request straddles a boundary; it is never below zero.
func (s *Store) evaluateGroups(ctx context.Context, deadline time.Time, checks []limit.Check, groups []slotGroup) ([]limit.Result, error) {
	results := make([]limit.Result, len(checks))
	sub := func(idx []int, edit func(*limit.Check)) []limit.Check { return limit.Subset(checks, idx, edit) }
	for g, grp := range groups {
		res, err := s.eval(ctx, deadline, sub(grp.idx, nil))
		if err != nil {
			s.undo(ctx, deadline, checks, groups[:g], results, nil)
			return nil, err
		}
		rejected := false
		for j, i := range grp.idx {
			results[i] = res[j]
			if res[j].Over && !checks[i].NoVeto && !checks[i].Refund {
				rejected = true
			}
		}
		if rejected {
			if err := s.undo(ctx, deadline, checks, groups[:g], results, groups[g+1:]); err != nil {
				return nil, err
			}
			return results, nil
		}
	}
	return results, nil
}

// undo refunds what the done groups consumed and reads the rest (refunds
// among them still apply), concurrently, filling results.
func (s *Store) undo(ctx context.Context, deadline time.Time, checks []limit.Check, done []slotGroup, results []limit.Result, rest []slotGroup) error {
	type call struct {
		idx    []int
		checks []limit.Check
	}
	var calls []call
	for _, grp := range done {
		var c call
		for _, i := range grp.idx {
			ch := checks[i]
			if ch.Refund || ch.Hits == 0 || results[i].Over {
				continue
			}
			ch.Refund = true
			c.idx, c.checks = append(c.idx, i), append(c.checks, ch)
		}
		if len(c.idx) > 0 {
			calls = append(calls, c)
		}
	}
	for _, grp := range rest {
		var c call
		for _, i := range grp.idx {
			ch := checks[i]
			if !ch.Refund {
				ch.Hits = 0
			}
			c.idx, c.checks = append(c.idx, i), append(c.checks, ch)
		}
		calls = append(calls, c)
	}
	errs := make([]error, len(calls))
	var wg sync.WaitGroup
	for k, c := range calls {
		wg.Go(func() {
			res, err := s.eval(ctx, deadline, c.checks)
			if err != nil {
				errs[k] = err
				return
			}
			for j, i := range c.idx {
				if checks[i].Refund || c.checks[j].Refund {
					results[i].Remaining, results[i].ResetUS = res[j].Remaining, res[j].ResetUS
				} else {
					// A read: over when this request's hits would not fit.
					results[i] = res[j]
					results[i].Over = checks[i].Hits > res[j].Remaining
				}
			}
		})
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}
