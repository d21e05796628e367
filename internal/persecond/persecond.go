// Package persecond keeps the counters of one-second windows in a Redis
// of their own (--redis-persecond-url, envoyproxy/ratelimit's
// REDIS_PERSECOND): the busiest, shortest-lived keys off the main Redis.
// A request whose counters span both stays all or nothing: the main
// store decides first, then the per-second one; when the second rejects,
// what the first consumed is given back, as the Cluster store does across
// hash slots.
package persecond

import (
	"context"
	"fmt"

	"github.com/ratelimitd/ratelimitd/internal/limit"
)

// Window is the window whose counters go to the per-second store, in µs.
const Window = 1_000_000

// Evaluator decides checks; both stores are one.
type Evaluator interface {
	Evaluate(ctx context.Context, checks []limit.Check) ([]limit.Result, error)
}

// Store routes checks by window to Main or PerSecond.
type Store struct {
	Main, PerSecond Evaluator
}

// Evaluate decides checks, all or nothing across the two stores: the
// main store first, as limit.EvaluateInOrder does across groups.
func (s *Store) Evaluate(ctx context.Context, checks []limit.Check) ([]limit.Result, error) {
	mainIdx, fastIdx := split(len(checks), func(i int) int64 { return checks[i].WindowUS })
	switch {
	case len(fastIdx) == 0:
		return s.Main.Evaluate(ctx, checks)
	case len(mainIdx) == 0:
		return s.PerSecond.Evaluate(ctx, checks)
	}
	return limit.EvaluateInOrder(ctx, checks, []limit.Group{
		{Idx: mainIdx, Eval: s.Main.Evaluate},
		{Idx: fastIdx, Eval: s.PerSecond.Evaluate},
	})
}

// split returns the indexes of n items by store: those of other windows
// (main), those of one-second windows (fast).
func split(n int, window func(i int) int64) (mainIdx, fastIdx []int) {
	for i := range n {
		if window(i) == Window {
			fastIdx = append(fastIdx, i)
		} else {
			mainIdx = append(mainIdx, i)
		}
	}
	return mainIdx, fastIdx
}

// granter takes and gives back grants (both stores of ratelimitd do).
type granter interface {
	Grant(ctx context.Context, ops []limit.GrantOp) ([]limit.GrantResult, error)
}

// Grant routes each op by window as Evaluate does; both stores must
// grant.
func (s *Store) Grant(ctx context.Context, ops []limit.GrantOp) ([]limit.GrantResult, error) {
	mainIdx, fastIdx := split(len(ops), func(i int) int64 { return ops[i].Check.WindowUS })
	out := make([]limit.GrantResult, len(ops))
	for _, part := range []struct {
		idx []int
		e   Evaluator
	}{{mainIdx, s.Main}, {fastIdx, s.PerSecond}} {
		if len(part.idx) == 0 {
			continue
		}
		g, ok := part.e.(granter)
		if !ok {
			return nil, fmt.Errorf("persecond: %T cannot grant", part.e)
		}
		sub := make([]limit.GrantOp, len(part.idx))
		for j, i := range part.idx {
			sub[j] = ops[i]
		}
		res, err := g.Grant(ctx, sub)
		if err != nil {
			return nil, err
		}
		for j, i := range part.idx {
			out[i] = res[j]
		}
	}
	return out, nil
}

// KeepCharges hands each store the usage charges of its windows to keep
// (service.ChargeKeeper), and reports whether any was kept.
func (s *Store) KeepCharges(checks []limit.Check) bool {
	mainIdx, fastIdx := split(len(checks), func(i int) int64 { return checks[i].WindowUS })
	kept := false
	for _, part := range []struct {
		idx []int
		e   Evaluator
	}{{mainIdx, s.Main}, {fastIdx, s.PerSecond}} {
		k, ok := part.e.(interface{ KeepCharges([]limit.Check) bool })
		if !ok || len(part.idx) == 0 {
			continue
		}
		sub := make([]limit.Check, len(part.idx))
		for j, i := range part.idx {
			sub[j] = checks[i]
		}
		kept = k.KeepCharges(sub) || kept
	}
	return kept
}
