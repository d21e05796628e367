// Package memstore is the embedded, in-process store: the same semantics as
// redisstore (decided by [limit.Decide]), for a single instance,
// for trying ratelimitd out, and as the oracle the Redis store is tested
// against. Limits are per process: two instances each admit the full limit.
package memstore

import (
	"context"
	"hash/maphash"
	"slices"
	"sync"
	"time"

	"github.com/ratelimitd/ratelimitd/internal/limit"
)

const shards = 64

// Options configures a [Store].
type Options struct {
	// Now is the store's clock. Nil means [time.Now].
	Now func() time.Time
}

// Store keeps counters in memory. It is safe for concurrent use.
type Store struct {
	now    func() time.Time
	seed   maphash.Seed
	shards [shards]shard
}

type shard struct {
	mu        sync.Mutex
	counters  map[string]counter
	nextSweep int64 // µs
}

type counter struct {
	state    limit.State
	expireAt int64 // µs; the state is useless from then on
}

// New returns an empty store.
func New(opts Options) *Store {
	s := &Store{now: opts.Now, seed: maphash.MakeSeed()}
	if s.now == nil {
		s.now = time.Now
	}
	for i := range s.shards {
		s.shards[i].counters = map[string]counter{}
	}
	return s
}

// Evaluate decides checks atomically: the shards they touch are locked
// together (in index order, so concurrent calls cannot deadlock).
func (s *Store) Evaluate(_ context.Context, checks []limit.Check) ([]limit.Result, error) {
	now := s.now().UnixMicro()
	idx := make([]int, len(checks))
	locked := make([]int, 0, len(checks))
	for i, c := range checks {
		idx[i] = int(maphash.String(s.seed, c.Key) % shards)
		locked = append(locked, idx[i])
	}
	slices.Sort(locked)
	locked = slices.Compact(locked)
	for _, i := range locked {
		s.shards[i].mu.Lock()
		s.shards[i].sweepLocked(now)
	}
	states := make([]limit.State, len(checks))
	found := make([]bool, len(checks))
	for i, c := range checks {
		if ctr, ok := s.shards[idx[i]].counters[c.Key]; ok && ctr.expireAt > now {
			states[i], found[i] = ctr.state, true
		}
		// A request's pair lives beside its counter, in its shard.
		states[i].PairMS, states[i].PairFlew = 0, false
		if c.PairID != "" {
			if p, ok := s.shards[idx[i]].counters[pairKey(c)]; ok && p.expireAt > now {
				states[i].PairMS, states[i].PairFlew = p.state.PairMS, p.state.PairFlew
			}
		}
	}
	results := make([]limit.Result, len(checks))
	expire := make([]int64, len(checks))
	limit.Decide(checks, states, found, now, results, expire)
	for i, c := range checks {
		sh := &s.shards[idx[i]]
		if c.PairID != "" {
			if at := limit.PairExpireUS(&c, &states[i]); at == 0 {
				delete(sh.counters, pairKey(c))
			} else {
				sh.counters[pairKey(c)] = counter{state: limit.State{PairMS: states[i].PairMS, PairFlew: states[i].PairFlew}, expireAt: at}
			}
			states[i].PairMS, states[i].PairFlew = 0, false
		}
		if expire[i] == 0 {
			delete(sh.counters, c.Key)
		} else {
			sh.counters[c.Key] = counter{state: states[i], expireAt: expire[i]}
		}
	}
	for _, i := range locked {
		s.shards[i].mu.Unlock()
	}
	return results, nil
}

// pairKey is where a request's pair is kept: beside its counter's key,
// behind a NUL no counter key holds.
func pairKey(c limit.Check) string { return c.Key + "\x00pair\x00" + c.PairID }

// Len drops expired counters and returns the number of live ones, for
// tests and metrics.
func (s *Store) Len() int {
	now := s.now().UnixMicro()
	n := 0
	for i := range s.shards {
		s.shards[i].mu.Lock()
		s.shards[i].sweepLocked(now)
		n += len(s.shards[i].counters)
		s.shards[i].mu.Unlock()
	}
	return n
}

// sweepLocked drops expired counters at most once a second per shard, so
// memory follows the live keys without a goroutine of its own.
func (sh *shard) sweepLocked(now int64) {
	if now < sh.nextSweep {
		return
	}
	sh.nextSweep = now + int64(time.Second/time.Microsecond)
	for k, c := range sh.counters {
		if c.expireAt <= now {
			delete(sh.counters, k)
		}
	}
}

// Grant takes or gives back lease hits (limit.Grant, limit.GiveBack) and
// settles charges (limit.Settle), each op on its own counter state, as
// redisstore's grant script does.
func (s *Store) Grant(_ context.Context, ops []limit.GrantOp) ([]limit.GrantResult, error) {
	now := s.now().UnixMicro()
	out := make([]limit.GrantResult, len(ops))
	for i := range ops {
		c := &ops[i].Check
		sh := &s.shards[maphash.String(s.seed, c.Key)%shards]
		sh.mu.Lock()
		sh.sweepLocked(now)
		ctr, found := sh.counters[c.Key]
		found = found && ctr.expireAt > now
		st := ctr.state
		r := &out[i]
		switch {
		case ops[i].Settle:
			// In process, a settle is never unanswered: no marks to keep.
			r.Hits = limit.Settle(c, &st, found, now, ops[i].WindowEndUS, c.SaturatedHits())
		case ops[i].GiveBack:
			r.Hits = limit.GiveBack(c, &st, found, now, ops[i].WindowEndUS, c.SaturatedHits())
		default:
			r.Hits = limit.Grant(c, &st, found, now, c.SaturatedHits())
		}
		var expire int64
		r.Remaining, r.ResetUS, expire = limit.Report(c, &st, now)
		if c.Algorithm != limit.TokenBucket {
			r.WindowEndUS = st.End
		}
		if expire == 0 {
			delete(sh.counters, c.Key)
		} else {
			sh.counters[c.Key] = counter{state: st, expireAt: expire}
		}
		sh.mu.Unlock()
	}
	return out, nil
}
