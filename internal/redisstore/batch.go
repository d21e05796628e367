package redisstore

import (
	"context"
	"errors"
	"time"

	"github.com/redis/go-redis/v9"
)

// Batching: concurrent requests' script calls are sent together. Each of
// a few dispatchers takes one queued call, adds whatever else has queued
// meanwhile (up to maxBatch), and sends them as one script call: one write,
// one round trip, one read on Redis's side for many decisions. There is
// no timer: at low load a call goes out at once, alone; under load the
// batches grow by themselves while the previous round trips are in
// flight. Each call keeps its own deadline (its caller stops waiting when
// it passes) and its own reply: one call's error reply never fails its
// neighbours.
//
// A batch goes out as ONE script call deciding its requests in order, each
// all or nothing: a pipeline of one EVALSHA per request was measured first
// (docs/BENCHMARKS.md) and left the per-call script cost — half of the
// script's time — on every request. A Redis error in one request (its key
// holds another type, a refused write) ends only that request: the script
// catches it and reports it in that request's part of the reply.

const (
	// maxBatch bounds one batch, so a burst cannot build a reply large
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
	ctx    context.Context
	keys   []string
	perKey []any
	done   chan struct{} // closed once res and err are set
	res    []any
	err    error
}

// submit queues a call and waits for its reply or its context.
func (s *Store) submit(ctx context.Context, keys []string, perKey []any) ([]any, error) {
	c := &call{ctx: ctx, keys: keys, perKey: perKey, done: make(chan struct{})}
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

// send runs one batch as one script call, bounded by the latest deadline of its
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
	keys := make([][]string, len(live))
	perKey := make([][]any, len(live))
	for i, c := range live {
		keys[i], perKey[i] = c.keys, c.perKey
	}
	vals, err := s.run(ctx, keys, perKey)
	k0 := 0
	for _, c := range live {
		if err != nil {
			c.err = err
		} else {
			c.res, c.err = splitReply(vals, k0, len(c.keys))
		}
		k0 += len(c.keys)
		close(c.done)
	}
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
