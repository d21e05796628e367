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
	var mainIdx, fastIdx []int
	for i, c := range checks {
		if c.WindowUS == Window {
			fastIdx = append(fastIdx, i)
		} else {
			mainIdx = append(mainIdx, i)
		}
	}
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

// Granter takes and gives back grants (both stores of ratelimitd are).
type Granter interface {
	Grant(ctx context.Context, ops []limit.GrantOp) ([]limit.GrantResult, error)
}

// Grant routes each op by window as Evaluate does; both stores must be
// Granters.
func (s *Store) Grant(ctx context.Context, ops []limit.GrantOp) ([]limit.GrantResult, error) {
	out := make([]limit.GrantResult, len(ops))
	for _, st := range []struct {
		fast bool
		e    Evaluator
	}{{false, s.Main}, {true, s.PerSecond}} {
		var idx []int
		var part []limit.GrantOp
		for i, op := range ops {
			if (op.Check.WindowUS == Window) == st.fast {
				idx, part = append(idx, i), append(part, op)
			}
		}
		if len(part) == 0 {
			continue
		}
		g, ok := st.e.(Granter)
		if !ok {
			return nil, fmt.Errorf("persecond: %T cannot grant", st.e)
		}
		res, err := g.Grant(ctx, part)
		if err != nil {
			return nil, err
		}
		for j, i := range idx {
			out[i] = res[j]
		}
	}
	return out, nil
}
