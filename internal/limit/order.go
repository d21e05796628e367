package limit

import (
	"context"
	"fmt"
	"sync"
)

// Group is some of a request's checks, by index, that one call of Eval
// decides all or nothing: the checks of one hash slot, or of one store.
type Group struct {
	Idx  []int
	Eval func(ctx context.Context, checks []Check) ([]Result, error)
}

// EvaluateInOrder decides a request whose checks span groups that no one
// call can decide together: group by group, in the order given, stopping
// at the first that rejects. What the earlier groups consumed is then
// given back and the later groups are only read, so a rejected request
// consumes nothing; a group that fails gives back the earlier ones'
// consumption too. The fixed order works like lock ordering: requests
// that contend for the same counters reach the later groups only if they
// passed the earlier ones, so N concurrent identical requests at a limit
// of 10 admit exactly 10. (Deciding the groups concurrently and giving
// back on reject admitted 0 to 3 of 10 under 200 concurrent requests:
// each request's transient consumption in one group rejected others
// there.) A give-back can land in the next window when the request
// straddles a boundary; it is never below zero. Usage charges are the
// exception: recorded whatever the decision, they are never given back,
// and a later group's are charged, not read.
func EvaluateInOrder(ctx context.Context, checks []Check, groups []Group) ([]Result, error) {
	results := make([]Result, len(checks))
	for g, grp := range groups {
		res, err := grp.Eval(ctx, Subset(checks, grp.Idx, nil))
		if err != nil {
			if uerr := undo(ctx, checks, groups[:g], results, nil); uerr != nil {
				return nil, fmt.Errorf("%w (and giving back the earlier groups' hits: %w)", err, uerr)
			}
			return nil, err
		}
		rejected := false
		for j, i := range grp.Idx {
			results[i] = res[j]
			if res[j].Over && !checks[i].NoVeto && !checks[i].Refund {
				rejected = true
			}
		}
		if rejected {
			if err := undo(ctx, checks, groups[:g], results, groups[g+1:]); err != nil {
				return nil, err
			}
			return results, nil
		}
	}
	return results, nil
}

// undo gives back what the done groups consumed and reads the rest
// (refunds among them still apply), concurrently, filling results.
func undo(ctx context.Context, checks []Check, done []Group, results []Result, rest []Group) error {
	type call struct {
		idx    []int
		checks []Check
		eval   func(ctx context.Context, checks []Check) ([]Result, error)
	}
	var calls []call
	for _, grp := range done {
		c := call{eval: grp.Eval}
		for _, i := range grp.Idx {
			ch := checks[i]
			if ch.Refund || ch.Hits == 0 || results[i].Over || ch.Usage {
				continue // consumed nothing, or a usage charge: kept
			}
			ch.Refund = true
			c.idx, c.checks = append(c.idx, i), append(c.checks, ch)
		}
		if len(c.idx) > 0 {
			calls = append(calls, c)
		}
	}
	for _, grp := range rest {
		c := call{idx: grp.Idx, eval: grp.Eval, checks: Subset(checks, grp.Idx, func(ch *Check) {
			if !ch.Refund && !ch.Charge() {
				ch.Hits, ch.Usage = 0, false
			}
		})}
		calls = append(calls, c)
	}
	errs := make([]error, len(calls))
	var wg sync.WaitGroup
	for k, c := range calls {
		wg.Go(func() {
			res, err := c.eval(ctx, c.checks)
			if err != nil {
				errs[k] = err
				return
			}
			for j, i := range c.idx {
				if checks[i].Charge() {
					results[i] = res[j]
				} else if checks[i].Refund || c.checks[j].Refund {
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
