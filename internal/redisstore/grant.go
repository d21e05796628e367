package redisstore

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratelimitd/ratelimitd/internal/limit"
)

// grant.lua's ops (TAKE, GIVE_BACK, SETTLE in scripts/contract.lua),
// and the arguments each takes.
const (
	grantTake, grantGiveBack, grantSettle = 1, 2, 3
	grantArgs                             = 9
)

// GrantOp and GrantResult are limit's: memstore grants too.
type (
	GrantOp     = limit.GrantOp
	GrantResult = limit.GrantResult
)

// Grant takes or gives back lease hits, one script call for all ops (one
// per hash slot on Cluster, made at once). It is
// not batched with decisions: grants are few and made ahead of need.
func (s *Store) Grant(ctx context.Context, ops []GrantOp) ([]GrantResult, error) {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	return s.GrantWithin(ctx, ops)
}

// GrantWithin is Grant within ctx's deadline alone: the lease refiller's,
// which may wait longer than a request would.
func (s *Store) GrantWithin(ctx context.Context, ops []GrantOp) ([]GrantResult, error) {
	if len(ops) == 0 {
		return nil, nil
	}
	if s.cluster != nil && len(ops) > 1 {
		if groups := groupBySlot(len(ops), func(i int) string { return ops[i].Check.Key }); len(groups) > 1 {
			return s.grantBySlot(ctx, ops, groups)
		}
	}
	return s.grantCall(ctx, ops)
}

// grantSlotCalls bounds the script calls a Cluster grant makes at once.
const grantSlotCalls = 16

// grantBySlot runs ops on Cluster, where a call's keys share a hash
// slot: one call per slot, made at once, so that a draw for many
// counters takes a round trip, not one per counter. Any call failing
// fails them all, as one call would (what the others did stands, as an
// unanswered call's may).
func (s *Store) grantBySlot(ctx context.Context, ops []GrantOp, groups []slotGroup) ([]GrantResult, error) {
	out := make([]GrantResult, len(ops))
	errs := make(chan error, len(groups))
	sem := make(chan struct{}, grantSlotCalls)
	var wg sync.WaitGroup
	for _, g := range groups {
		idx := g.idx
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			part := make([]GrantOp, len(idx))
			for k, i := range idx {
				part[k] = ops[i]
			}
			r, err := s.grantCall(ctx, part)
			if err != nil {
				errs <- err
				return
			}
			for k, i := range idx {
				out[i] = r[k]
			}
		})
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return nil, err
	}
	return out, nil
}

// grantCall runs ops, whose keys share a slot on Cluster, in one script
// call.
func (s *Store) grantCall(ctx context.Context, ops []GrantOp) ([]GrantResult, error) {
	keys := make([]string, 0, len(ops))
	args := make([]any, 0, 1+grantArgs*len(ops))
	args = append(args, s.nowArg())
	for _, op := range ops {
		c := op.Check
		keys = append(keys, c.Key)
		kind, settler := grantTake, ""
		switch {
		case op.Settle:
			kind, settler = grantSettle, op.Settler
			keys = append(keys, SettleMarksKey(c.Key))
		case op.GiveBack:
			kind = grantGiveBack
		}
		args = append(args, kind, c.SaturatedHits(), c.Limit, c.WindowUS, uint8(c.Algorithm), c.Burst, op.WindowEndUS, settler, op.Seq)
	}
	start, deadline := time.Now(), time.Now().Add(s.timeout)
	if dl, ok := ctx.Deadline(); ok {
		deadline = dl
	}
	var c redis.Scripter = s.client
	res, err := s.grantScript.EvalSha(ctx, c, keys, args...).Result()
	if err != nil && isNoScript(err) {
		res, err = s.grantScript.Eval(ctx, c, keys, args...).Result()
	}
	s.breaker.roundTrip(start, deadline, err)
	vals, err := checkReplyOf(res, err, 4*len(ops))
	if err != nil {
		return nil, fmt.Errorf("redisstore: eval grant (%d ops): %w: %w", len(ops), ErrUnavailable, err)
	}
	out := make([]GrantResult, len(ops))
	for i := range out {
		hits, _ := vals[4*i].(int64)
		remaining, _ := vals[4*i+1].(int64)
		reset, _ := vals[4*i+2].(int64)
		end, _ := vals[4*i+3].(int64)
		out[i] = GrantResult{Hits: uint64(hits), Remaining: uint64(remaining), ResetUS: reset, WindowEndUS: end}
	}
	return out, nil
}

// SettleMarksKey is the key of the settle marks of counter key: in the
// same Cluster hash slot (its hash tag is key's own, or key whole).
func SettleMarksKey(key string) string {
	return slotKey(key, "|settled")
}
