package redisstore

import (
	"context"
	"errors"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratelimitd/ratelimitd/internal/limit"
)

// Batching: concurrent requests' script calls are sent together. Each
// Redis server the store writes to has its own batcher — one in single and
// sentinel modes, one per master on Cluster, so that a slow master holds
// back only its own calls. Each of its dispatchers (one by default) takes
// one queued call, adds whatever else has queued meanwhile (up to
// maxBatch), and sends them as one script call (on Cluster, one per hash
// slot, pipelined on the master's connection): one write,
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
// script's time — on every request. A Redis error in one request (a
// refused write) ends only that request: the script catches it and reports
// it in that request's part of the reply; a call Redis refuses before
// running it because of one key (NOPERM) is asked again request by request.

const (
	// maxBatch and maxBatchKeys bound one batch, so a burst cannot build
	// a reply large enough to delay its first callers.
	maxBatch     = 128
	maxBatchKeys = 4096
	// queueSize bounds the calls waiting for a dispatcher: beyond it Redis
	// is not keeping up, and failing at once (answered by policy) beats
	// queueing without bound.
	queueSize = 4096
)

// errQueueFull is returned when the batch queue is full.
var errQueueFull = errors.New("redisstore: batch queue full")

// call is one script evaluation waiting for a dispatcher. Whoever
// finishes it first — its dispatcher, or its deadline — sets its answer
// and signals done once; a later finish finds it finished and does
// nothing.
type call struct {
	ctx      context.Context
	deadline time.Time
	checks   []limit.Check
	// done holds one signal: the finisher's send never blocks, even when
	// the caller has stopped waiting.
	done     chan struct{}
	finished atomic.Bool
	res      []any
	err      error
	batch    int // the calls its round trip carried
	// journal, when set, settles its usage charges: its dispatcher
	// does, whatever the round trip brings, before answering (the
	// caller may reuse the call then).
	journal *journal
}

// finish answers c unless it is already answered. The finisher must not
// touch c afterwards: its caller may reuse it at once.
//
// Only the dispatcher finishes a call: a deadline answers its caller
// (answer) and leaves the call to the dispatcher, whose finish settles
// its charges with what the round trip brought (a late answer is a
// recorded charge).
func (c *call) finish(res []any, batch int, err error) {
	if c.journal != nil {
		c.journal.settle(c.checks, results(res, len(c.checks)), err)
	}
	c.answer(res, batch, err)
}

// answer gives the caller its answer unless it has one.
func (c *call) answer(res []any, batch int, err error) {
	if !c.finished.CompareAndSwap(false, true) {
		return
	}
	c.res, c.batch, c.err = res, batch, err
	c.done <- struct{}{}
}

// calls are reused once nothing else can still hold them: answered by
// their dispatcher while their deadline had not fired (see submit).
var calls = sync.Pool{New: func() any { return &call{done: make(chan struct{}, 1)} }}

// expiry finishes a call when its deadline passes: one timer function
// per caller, reused between calls, instead of a timer channel in the
// caller's select (which Go keeps in the timer heap only while the
// caller blocks on it, at a cost on every wait).
type expiry struct {
	t *time.Timer
	c atomic.Pointer[call]
}

// expiries are reused when stopped before they fired; one that fired
// is left to the collector, as its function may still be running.
var expiries = sync.Pool{New: func() any {
	e := &expiry{}
	e.t = time.AfterFunc(time.Hour, e.fire)
	e.t.Stop()
	return e
}}

func (e *expiry) fire() {
	if c := e.c.Load(); c != nil {
		c.answer(nil, 0, context.DeadlineExceeded)
	}
}

// batcher queues the calls bound for one Redis server.
type batcher struct {
	queue chan *call
	// client is the store's client, or on Cluster one master's; node is
	// set on Cluster.
	client redis.Scripter
	node   *redis.Client
	// quit is closed when a Cluster batcher retires (see dispatch).
	quit chan struct{}
}

// nodeIdle is how long a Cluster master's batcher waits for calls before
// it retires (Store.nodeIdle, which tests shorten): go-redis gives a
// master a new client when the cluster's shape changes, and the old
// client's batcher would otherwise idle until the store closes.
const nodeIdle = time.Minute

// newBatcher makes a batcher and starts its dispatchers.
func (s *Store) newBatcher(client redis.Scripter, node *redis.Client) *batcher {
	b := &batcher{queue: make(chan *call, queueSize), client: client, node: node, quit: make(chan struct{})}
	for range s.dispatchers {
		s.wg.Go(func() { s.dispatch(b) })
	}
	return b
}

// enqueue hands c to the batcher of the server that holds its keys,
// without waiting: a full queue is errQueueFull.
func (s *Store) enqueue(ctx context.Context, c *call) error {
	if s.cluster == nil {
		return offer(s.single, c)
	}
	node, err := s.cluster.MasterForKey(ctx, c.checks[0].Key)
	if err != nil {
		return err
	}
	return s.nodes.offer(node, c, func() *batcher { return s.newBatcher(node, node) })
}

// registry holds a Cluster store's batchers, one per master client. Calls
// are offered under its read lock, and a batcher retires under its write
// lock only with its queue empty: no call lands in a retired queue.
type registry struct {
	mu     sync.RWMutex
	m      map[*redis.Client]*batcher
	closed bool
}

// offer queues c in node's batcher, made by newB when node has none.
func (r *registry) offer(node *redis.Client, c *call, newB func() *batcher) error {
	r.mu.RLock()
	if b := r.m[node]; b != nil {
		err := offer(b, c)
		r.mu.RUnlock()
		return err
	}
	r.mu.RUnlock()
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return redis.ErrClosed
	}
	b := r.m[node]
	if b == nil {
		if r.m == nil {
			r.m = map[*redis.Client]*batcher{}
		}
		b = newB()
		r.m[node] = b
	}
	return offer(b, c)
}

// retire removes an idle batcher, unless a call has just been queued in
// it, and reports whether b is retired.
func (r *registry) retire(b *batcher) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	select {
	case <-b.quit:
		return true
	default:
	}
	if len(b.queue) > 0 {
		return false
	}
	if r.m[b.node] == b {
		delete(r.m, b.node)
	}
	close(b.quit)
	return true
}

// close makes no batcher after it.
func (r *registry) close() {
	r.mu.Lock()
	r.closed = true
	r.mu.Unlock()
}

// len returns the number of batchers.
func (r *registry) len() int {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return len(r.m)
}

// offer queues c in b unless the queue is full.
func offer(b *batcher, c *call) error {
	select {
	case b.queue <- c:
		return nil
	default:
		return errQueueFull
	}
}

// submit queues a call and waits for its reply, its deadline or its
// context; batch is how many calls its round trip carried (0 when it
// made none).
func (s *Store) submit(ctx context.Context, deadline time.Time, checks []limit.Check, keep bool) (vals []any, batch int, err error) {
	c := calls.Get().(*call)
	c.ctx, c.deadline, c.checks = ctx, deadline, checks
	if keep {
		c.journal = s.journal
	}
	if err := s.enqueue(ctx, c); err != nil {
		c.reuse()
		if keep {
			s.journal.settle(checks, nil, err)
		}
		return nil, 0, err
	}
	e := expiries.Get().(*expiry)
	e.c.Store(c)
	e.t.Reset(time.Until(deadline))
	select {
	case <-c.done:
		vals, batch, err = c.res, c.batch, c.err
		if e.t.Stop() {
			// The deadline never fired, so the dispatcher answered, and
			// has let go of c; nothing holds either any more.
			e.reuse()
			c.reuse()
		}
		return vals, batch, err
	case <-ctx.Done():
		// c stays with its dispatcher, which answers it to no one.
		if e.t.Stop() {
			e.reuse()
		}
		return nil, 0, ctx.Err()
	}
}

func (e *expiry) reuse() {
	e.c.Store(nil)
	expiries.Put(e)
}

func (c *call) reuse() {
	*c = call{done: c.done}
	calls.Put(c)
}

// gatherAfter is the previous batch's size from which a dispatcher yields
// once before taking what is queued.
const gatherAfter = 4

// dispatch sends b's batches until the store closes.
func (s *Store) dispatch(b *batcher) {
	batch := make([]*call, 0, maxBatch)
	last := 0 // the size of the previous batch
	// A Cluster batcher retires after nodeIdle without calls.
	var timer *time.Timer
	var idle <-chan time.Time
	if b.node != nil {
		timer = time.NewTimer(s.nodeIdle)
		defer timer.Stop()
		idle = timer.C
	}
	for {
		select {
		case <-s.done:
			failQueued(b)
			return
		case <-b.quit:
			return
		case <-idle:
			if s.nodes.retire(b) {
				return
			}
			timer.Reset(s.nodeIdle)
			continue
		case c := <-b.queue:
			batch = append(batch[:0], c)
		}
		keys := len(batch[0].checks)
		if last >= gatherAfter {
			// Under load: let the request goroutines already running
			// queue theirs before this batch leaves, so fewer round
			// trips carry the same decisions (about a fifth more a
			// batch at 64 callers; a yield more gathers little more).
			runtime.Gosched()
		}
	fill:
		for len(batch) < maxBatch && keys < maxBatchKeys {
			select {
			case c := <-b.queue:
				batch = append(batch, c)
				keys += len(c.checks)
			default:
				break fill
			}
		}
		s.m.Batch(len(batch))
		last = len(batch)
		s.send(b, batch)
		if timer != nil {
			timer.Reset(s.nodeIdle)
		}
	}
}

// send runs one batch as one script call (one per slot on Cluster),
// bounded by the latest deadline of its calls (each caller still stops
// waiting at its own).
func (s *Store) send(b *batcher, batch []*call) {
	live := batch[:0]
	now := time.Now()
	deadline := now
	for _, c := range batch {
		err := c.ctx.Err()
		if err == nil && !c.deadline.After(now) {
			err = context.DeadlineExceeded
		}
		if err != nil {
			c.finish(nil, 0, err)
			continue
		}
		if c.deadline.After(deadline) {
			deadline = c.deadline
		}
		live = append(live, c)
	}
	if len(live) == 0 {
		return
	}
	// Evaluate has already bounded every call's deadline by the timeout.
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	if b.node != nil {
		s.sendSlots(ctx, b, live)
		return
	}
	start := time.Now()
	vals, err := s.runOn(ctx, b.client, requests(live))
	s.breaker.roundTrip(start, deadline, err)
	s.deliver(ctx, live, len(live), vals, err)
}

// requests returns the calls' checks.
func requests(calls []*call) [][]limit.Check {
	reqs := make([][]limit.Check, len(calls))
	for i, c := range calls {
		reqs[i] = c.checks
	}
	return reqs
}

// deliver hands each call its part of one script call's reply; batch is
// how many calls the round trip carried.
func (s *Store) deliver(ctx context.Context, calls []*call, batch int, vals []any, err error) {
	if err != nil && len(calls) > 1 && refusedWhole(err) {
		s.runAlone(ctx, calls, batch)
		return
	}
	k0 := 0
	for _, c := range calls {
		n := len(c.checks)
		if err != nil {
			c.finish(nil, batch, err)
		} else {
			res, err := splitReply(vals, k0, n)
			c.finish(res, batch, err)
		}
		k0 += n
	}
}
