package redisstore

import (
	"context"
	"slices"
	"time"

	"github.com/ratelimitd/ratelimitd/internal/limit"
)

// slotGroup is the indexes of one request's checks that share a slot.
type slotGroup struct {
	slot int
	idx  []int
}

// groupBySlot returns the indexes of n keys (key(i) the i-th) per hash
// slot, in slot order.
func groupBySlot(n int, key func(int) string) []slotGroup {
	var groups []slotGroup
	at := map[int]int{} // slot -> its group
	for i := range n {
		sl := slot(key(i))
		g, ok := at[sl]
		if !ok {
			g = len(groups)
			at[sl] = g
			groups = append(groups, slotGroup{slot: sl})
		}
		groups[g].idx = append(groups[g].idx, i)
	}
	slices.SortFunc(groups, func(a, b slotGroup) int { return a.slot - b.slot })
	return groups
}

// evaluateGroups decides a request whose checks span several slots: one
// script call per slot, in ascending slot order (limit.EvaluateInOrder:
// the order is what lets contending requests admit exactly the limit).
// Each group is all or nothing by itself; keep: each group's usage
// charges are settled in the journal by its own call.
func (s *Store) evaluateGroups(ctx context.Context, deadline time.Time, checks []limit.Check, groups []slotGroup, keep bool) ([]limit.Result, error) {
	eval := func(ctx context.Context, cs []limit.Check) ([]limit.Result, error) {
		return s.eval(ctx, deadline, cs, keep && hasJournaled(cs))
	}
	ordered := make([]limit.Group, len(groups))
	for g, grp := range groups {
		ordered[g] = limit.Group{Idx: grp.idx, Eval: eval}
	}
	return limit.EvaluateInOrder(ctx, checks, ordered)
}
