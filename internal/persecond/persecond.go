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

// Evaluate decides checks, all or nothing across the two stores.
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
	results := make([]limit.Result, len(checks))
	first, err := s.Main.Evaluate(ctx, limit.Subset(checks, mainIdx, nil))
	if err != nil {
		return nil, err
	}
	place(results, mainIdx, first)
	if rejects(checks, mainIdx, first) {
		// Rejected already: the per-second counters are read, not
		// consumed (refunds still apply).
		read, err := s.PerSecond.Evaluate(ctx, limit.Subset(checks, fastIdx, func(c *limit.Check) {
			if !c.Refund {
				c.Hits = 0
			}
		}))
		if err != nil {
			return nil, err
		}
		place(results, fastIdx, read)
		for j, i := range fastIdx {
			if !checks[i].Refund && checks[i].Hits > 0 && read[j].Remaining < checks[i].Hits {
				results[i].Over = true
			}
		}
		return results, nil
	}
	second, err := s.PerSecond.Evaluate(ctx, limit.Subset(checks, fastIdx, nil))
	if err != nil {
		if uerr := s.undo(ctx, checks, mainIdx, first, results); uerr != nil {
			return nil, fmt.Errorf("%w (and giving back the main store's hits: %w)", err, uerr)
		}
		return nil, err
	}
	place(results, fastIdx, second)
	if rejects(checks, fastIdx, second) {
		if err := s.undo(ctx, checks, mainIdx, first, results); err != nil {
			return nil, err
		}
	}
	return results, nil
}

// undo gives back what the main store's checks consumed and reports the
// counters as they are after it.
func (s *Store) undo(ctx context.Context, checks []limit.Check, idx []int, res []limit.Result, results []limit.Result) error {
	var back []limit.Check
	var at []int
	for j, i := range idx {
		c := checks[i]
		if c.Refund || c.Hits == 0 || res[j].Over {
			continue // consumed nothing
		}
		c.Refund = true
		back, at = append(back, c), append(at, i)
	}
	if len(back) == 0 {
		return nil
	}
	r, err := s.Main.Evaluate(ctx, back)
	if err != nil {
		return err
	}
	for j, i := range at {
		results[i].Remaining, results[i].ResetUS = r[j].Remaining, r[j].ResetUS
	}
	return nil
}

// place puts the results of the checks at idx back in request order.
func place(results []limit.Result, idx []int, res []limit.Result) {
	for j, i := range idx {
		results[i] = res[j]
	}
}

// rejects reports whether a vetoing check at idx is over its limit.
func rejects(checks []limit.Check, idx []int, res []limit.Result) bool {
	for j, i := range idx {
		if res[j].Over && !checks[i].NoVeto && !checks[i].Refund {
			return true
		}
	}
	return false
}
