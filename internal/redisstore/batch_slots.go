package redisstore

// A batch on Redis Cluster split by hash slot, and the calls sent alone
// when a batch as a whole is refused.

import (
	"context"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratelimitd/ratelimitd/internal/limit"
)

// sendSlots sends a batch for one Cluster master, where one script call
// can only hold keys of one hash slot (each call's keys share one: see
// evaluateGroups): one script call per slot, pipelined on the master's
// connection. A slot that has moved since the store learned the map
// (MOVED, ASK) is sent again through the Cluster client, which follows the
// redirection and learns the new map.
func (s *Store) sendSlots(ctx context.Context, b *batcher, live []*call) {
	type group struct {
		slot  int
		calls []*call
		keys  []string
		args  []any
		cmd   *redis.Cmd
		err   error
	}
	var groups []*group
	for _, c := range live {
		sl := slot(c.checks[0].Key)
		i := slices.IndexFunc(groups, func(g *group) bool { return g.slot == sl })
		if i < 0 {
			i = len(groups)
			groups = append(groups, &group{slot: sl})
		}
		groups[i].calls = append(groups[i].calls, c)
	}
	start := time.Now()
	deadline, _ := ctx.Deadline()
	_, _ = b.node.Pipelined(ctx, func(p redis.Pipeliner) error {
		for _, g := range groups {
			if g.keys, g.args, g.err = s.scriptArgs(requests(g.calls)); g.err == nil {
				g.cmd = p.EvalSha(ctx, s.script.Hash(), g.keys, g.args...)
			}
		}
		return nil
	})
	for _, g := range groups {
		if g.err != nil {
			s.deliver(ctx, g.calls, len(live), nil, g.err)
			continue
		}
		res, err := g.cmd.Result()
		s.breaker.roundTrip(start, deadline, err)
		switch {
		case err != nil && isNoScript(err):
			s.reloads.Add(1)
			s.m.ScriptReload()
			res, err = s.script.Eval(ctx, b.node, g.keys, g.args...).Result()
		case err != nil && isRedirect(err):
			res, err = s.script.EvalSha(ctx, s.cluster, g.keys, g.args...).Result()
			if err != nil && isNoScript(err) {
				res, err = s.script.Eval(ctx, s.cluster, g.keys, g.args...).Result()
			}
		}
		vals, err := checkReply(res, err, counterKeys(requests(g.calls)))
		s.deliver(ctx, g.calls, len(live), vals, err)
	}
}

// isRedirect reports a Cluster redirection: the slot is served elsewhere.
func isRedirect(err error) bool {
	_, moved := redis.IsMovedError(err)
	_, ask := redis.IsAskError(err)
	return moved || ask
}

// refusedWhole reports an error reply that Redis gives before running a
// script call at all, for one of its keys: NOPERM for a key the ACL user
// may not touch. Nothing ran, so each request can be asked again alone.
// (A NOPERM for the command itself would refuse every request alike.)
func refusedWhole(err error) bool {
	// go-redis tells a NOPERM apart; which kind it is, only its text says.
	return redis.IsPermissionError(err) && strings.Contains(err.Error(), "keys")
}

// runAlone sends each call of a refused batch as its own script call,
// concurrently, so that a refusal reaches only the requests it concerns.
func (s *Store) runAlone(ctx context.Context, calls []*call, batch int) {
	var wg sync.WaitGroup
	for _, c := range calls {
		wg.Go(func() {
			start := time.Now()
			vals, err := s.run(ctx, [][]limit.Check{c.checks})
			if dl, ok := ctx.Deadline(); ok {
				s.breaker.roundTrip(start, dl, err)
			}
			if err == nil {
				vals, err = splitReply(vals, 0, len(c.checks))
			}
			c.finish(vals, batch, err)
		})
	}
	wg.Wait()
}

// failQueued answers every call still queued in b when the store closes.
func failQueued(b *batcher) {
	for {
		select {
		case c := <-b.queue:
			c.finish(nil, 0, redis.ErrClosed)
		default:
			return
		}
	}
}
