package redisstore

import (
	"context"
	"sync"

	"github.com/ratelimitd/ratelimitd/internal/limit"
)

// groupBySlot returns the indexes of checks per hash slot, in first-seen
// order.
func groupBySlot(checks []limit.Check) [][]int {
	var groups [][]int
	slots := make(map[int]int, len(checks))
	for i, c := range checks {
		sl := slot(c.Key)
		g, ok := slots[sl]
		if !ok {
			g = len(groups)
			slots[sl] = g
			groups = append(groups, nil)
		}
		groups[g] = append(groups[g], i)
	}
	return groups
}

// evaluateGroups runs one script call per slot group, concurrently. Each
// group is all or nothing by itself; when any group rejects the request
// (or fails), the groups that consumed are refunded, so the request as a
// whole consumes nothing. A refund can land in the next window when the
// request straddles a boundary; it is never below zero.
func (s *Store) evaluateGroups(ctx context.Context, checks []limit.Check, groups [][]int) ([]limit.Result, error) {
	type groupResult struct {
		res []limit.Result
		err error
	}
	out := make([]groupResult, len(groups))
	var wg sync.WaitGroup
	for g, idx := range groups {
		wg.Go(func() {
			sub := make([]limit.Check, len(idx))
			for j, i := range idx {
				sub[j] = checks[i]
			}
			out[g].res, out[g].err = s.eval(ctx, sub)
		})
	}
	wg.Wait()
	results := make([]limit.Result, len(checks))
	var firstErr error
	rejected := false
	for g, idx := range groups {
		if out[g].err != nil {
			if firstErr == nil {
				firstErr = out[g].err
			}
			continue
		}
		for j, i := range idx {
			results[i] = out[g].res[j]
			if results[i].Over && !checks[i].NoVeto && !checks[i].Refund {
				rejected = true
			}
		}
	}
	if !rejected && firstErr == nil {
		return results, nil
	}
	// Give back what the groups that admitted consumed.
	var refunds []limit.Check
	var refundIdx []int
	for g, idx := range groups {
		if out[g].err != nil || groupRejected(checks, out[g].res, idx) {
			continue
		}
		for j, i := range idx {
			c := checks[i]
			if c.Refund || c.Hits == 0 || out[g].res[j].Over {
				continue
			}
			c.Refund = true
			refunds = append(refunds, c)
			refundIdx = append(refundIdx, i)
		}
	}
	if len(refunds) > 0 {
		for _, grp := range groupBySlot(refunds) {
			sub := make([]limit.Check, len(grp))
			for j, k := range grp {
				sub[j] = refunds[k]
			}
			res, err := s.eval(ctx, sub)
			if err != nil {
				if firstErr == nil {
					firstErr = err
				}
				continue
			}
			for j, k := range grp {
				results[refundIdx[k]].Count = res[j].Count
			}
		}
	}
	if firstErr != nil {
		return nil, firstErr
	}
	return results, nil
}

func groupRejected(checks []limit.Check, res []limit.Result, idx []int) bool {
	for j, i := range idx {
		if res[j].Over && !checks[i].NoVeto && !checks[i].Refund {
			return true
		}
	}
	return false
}
