package redisstore

import (
	"context"
	"errors"
	"time"

	"github.com/redis/go-redis/v9"
)

// Batching: concurrent requests' script calls are sent together. Each of
// a few dispatchers takes one queued call, adds whatever else has queued
// meanwhile (up to maxBatch), and sends them as one pipeline: one write,
// one round trip, one read on Redis's side for many decisions. There is
// no timer: at low load a call goes out at once, alone; under load the
// batches grow by themselves while the previous round trips are in
// flight. Each call keeps its own deadline (its caller stops waiting when
// it passes) and its own reply: one call's error reply never fails its
// neighbours.
//
// One script call that decides several requests was the alternative; a
// pipeline of EVALSHA keeps each request's atomic evaluation and its
// error apart, and costs Redis one command dispatch per request, which
// the measurements in docs/BENCHMARKS.md show is not the bottleneck: the
// round trip's syscalls are.

const (
	// maxBatch bounds one pipeline, so a burst cannot build a reply large
	// enough to delay its first callers.
	maxBatch = 128
	// queueSize bounds the calls waiting for a dispatcher: beyond it Redis
	// is not keeping up, and failing at once (answered by policy) beats
	// queueing without bound.
	queueSize = 4096
)

// errQueueFull is returned when the batch queue is full.
var errQueueFull = errors.New("redisstore: batch queue full")

// call is one script evaluation waiting for a dispatcher.
type call struct {
	ctx  context.Context
	keys []string
	args []any
	done chan struct{} // closed once res and err are set
	res  any
	err  error
}

// submit queues a call and waits for its reply or its context.
func (s *Store) submit(ctx context.Context, keys []string, args []any) (any, error) {
	c := &call{ctx: ctx, keys: keys, args: args, done: make(chan struct{})}
	select {
	case s.queue <- c:
	default:
		return nil, errQueueFull
	}
	select {
	case <-c.done:
		return c.res, c.err
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// dispatch sends batches until the store closes.
func (s *Store) dispatch() {
	batch := make([]*call, 0, maxBatch)
	for {
		select {
		case <-s.done:
			s.failQueued()
			return
		case c := <-s.queue:
			batch = append(batch[:0], c)
		}
	fill:
		for len(batch) < maxBatch {
			select {
			case c := <-s.queue:
				batch = append(batch, c)
			default:
				break fill
			}
		}
		s.m.Batch(len(batch))
		s.send(batch)
	}
}

// send runs one batch as a pipeline, bounded by the latest deadline of its
// calls (each caller still stops waiting at its own).
func (s *Store) send(batch []*call) {
	live := batch[:0]
	deadline := time.Now()
	for _, c := range batch {
		if err := c.ctx.Err(); err != nil {
			c.err = err
			close(c.done)
			continue
		}
		if dl, ok := c.ctx.Deadline(); ok && dl.After(deadline) {
			deadline = dl
		}
		live = append(live, c)
	}
	if len(live) == 0 {
		return
	}
	if limit := time.Now().Add(s.timeout); deadline.After(limit) || !deadline.After(time.Now()) {
		deadline = limit
	}
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	cmds := s.pipeline(ctx, live, false)
	var retry []int
	for i, cmd := range cmds {
		if err := cmd.Err(); err != nil && isNoScript(err) {
			retry = append(retry, i)
		}
	}
	if len(retry) > 0 {
		// Redis lost the script (restart, failover, SCRIPT FLUSH): send
		// those calls again with the body.
		s.reloads.Add(1)
		s.m.ScriptReload()
		again := make([]*call, len(retry))
		for j, i := range retry {
			again[j] = live[i]
		}
		for j, cmd := range s.pipeline(ctx, again, true) {
			cmds[retry[j]] = cmd
		}
	}
	for i, c := range live {
		c.res, c.err = cmds[i].Result()
		close(c.done)
	}
}

func (s *Store) pipeline(ctx context.Context, calls []*call, withBody bool) []*redis.Cmd {
	pipe := s.client.Pipeline()
	cmds := make([]*redis.Cmd, len(calls))
	for i, c := range calls {
		if withBody {
			cmds[i] = s.script.Eval(ctx, pipe, c.keys, c.args...)
		} else {
			cmds[i] = s.script.EvalSha(ctx, pipe, c.keys, c.args...)
		}
	}
	_, _ = pipe.Exec(ctx) // errors are per command
	return cmds
}

// failQueued answers every call still queued when the store closes.
func (s *Store) failQueued() {
	for {
		select {
		case c := <-s.queue:
			c.err = redis.ErrClosed
			close(c.done)
		default:
			return
		}
	}
}
