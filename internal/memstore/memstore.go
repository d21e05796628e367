// Package memstore is the embedded, in-process store: the same fixed-window
// semantics as redisstore (decided by [limit.Apply]), for a single instance,
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
	windowEnd int64 // µs
	count     uint64
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
	counts := make([]uint64, len(checks))
	ends := make([]int64, len(checks))
	for i, c := range checks {
		ends[i] = limit.WindowEnd(now, c.WindowUS)
		if ctr, ok := s.shards[idx[i]].counters[c.Key]; ok && ctr.windowEnd == ends[i] {
			counts[i] = ctr.count
		}
	}
	results := make([]limit.Result, len(checks))
	limit.Apply(checks, counts, results)
	for i, c := range checks {
		results[i].ResetUS = ends[i] - now
		sh := &s.shards[idx[i]]
		if counts[i] == 0 {
			delete(sh.counters, c.Key)
		} else {
			sh.counters[c.Key] = counter{windowEnd: ends[i], count: counts[i]}
		}
	}
	for _, i := range locked {
		s.shards[i].mu.Unlock()
	}
	return results, nil
}

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
		if c.windowEnd <= now {
			delete(sh.counters, k)
		}
	}
}
