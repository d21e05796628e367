package limit

import (
	"context"
	"fmt"
	"strings"
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
// given back and the later groups are decided as a refused request's
// (each with a check that is always over, [Refusal]): judged as one call
// would judge them, consuming nothing, so a rejected request consumes
// nothing and answers as it would in one call; a group that fails gives
// back the earlier ones' consumption too. The fixed order works like
// lock ordering: requests that contend for the same counters reach the
// later groups only if they passed the earlier ones, so N concurrent
// identical requests at a limit of 10 admit exactly 10. (Deciding the
// groups concurrently and giving back on reject admitted 0 to 3 of 10
// under 200 concurrent requests: each request's transient consumption
// in one group rejected others there.) A give-back can land in the next
// window when the request straddles a boundary; it is never below zero.
// Usage charges (Check.Charge) are the exception: recorded whatever the
// decision, they are never given back, and a later group's are charged
// as a refused request's are. Every other call on a usage rule (a
// request that costs its hits, a budget check that costs 1) is given
// back like any request's hits: only a stated charge is kept.
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

// Refusal returns a check that is always over and writes nothing (a limit
// of 0), keyed to share key's Redis Cluster hash slot: beside a group's
// checks, it makes one call decide them as a refused request's. Its key
// is never a counter's: a counter key holds no NUL byte after its hash
// tag.
func Refusal(key string) Check {
	tag := key
	if s := strings.IndexByte(key, '{'); s >= 0 {
		if e := strings.IndexByte(key[s+1:], '}'); e > 0 {
			tag = key[s+1 : s+1+e]
		}
	}
	return Check{Key: "{" + tag + "}\x00refused", Limit: 0, WindowUS: 1_000_000, Hits: 1}
}

// undo gives back what the done groups consumed and decides the rest as
// a refused request's (refunds and charges among them still apply),
// concurrently, filling results.
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
			// A budget check (a usage call stating 0) consumes no
			// hits but may have joined the flights: its give-back of 0
			// takes it out.
			check := ch.Usage && ch.Kind == ByHits && ch.Hits == 0 && ch.Algorithm == FixedWindow
			if ch.Refund || results[i].Over || ch.Charge() || ch.Hits == 0 && !check {
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
		cs := Subset(checks, grp.Idx, nil)
		calls = append(calls, call{idx: grp.Idx, eval: grp.Eval, checks: append(cs, Refusal(cs[0].Key))})
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
				if c.checks[j].Refund && !checks[i].Refund {
					// A give-back: the decision stands, the counter
					// is as it is now.
					results[i].Remaining, results[i].ResetUS = res[j].Remaining, res[j].ResetUS
				} else {
					results[i] = res[j]
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
