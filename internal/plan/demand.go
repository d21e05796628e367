package plan

import (
	"sync"
	"sync/atomic"

	"github.com/ratelimitd/ratelimitd/internal/limit"
)

// Demand counts the hits ShouldRateLimit is asked for on the counters
// that are watched: those RLQS buckets draw on, so that their grants
// can leave RLS callers of the same counter a share by demand. Calls
// refused count too: demand, not what was let through. Nothing is
// counted, and a request pays one atomic load, while no counter is
// watched. The zero value is usable.
type Demand struct {
	watched atomic.Int32
	keys    sync.Map // counter key → *atomic.Uint64
}

// Watch starts counting key's hits (a key watched already goes on).
func (d *Demand) Watch(key string) {
	if _, loaded := d.keys.LoadOrStore(key, new(atomic.Uint64)); !loaded {
		d.watched.Add(1)
	}
}

// Unwatch stops counting key's hits.
func (d *Demand) Unwatch(key string) {
	if _, ok := d.keys.LoadAndDelete(key); ok {
		d.watched.Add(-1)
	}
}

// Hits returns the hits asked for on key since it was watched.
func (d *Demand) Hits(key string) uint64 {
	if v, ok := d.keys.Load(key); ok {
		return v.(*atomic.Uint64).Load()
	}
	return 0
}

// Note counts the checks' hits on watched keys (a request, 1 hit, for
// a check stating none).
func (d *Demand) Note(checks []limit.Check) {
	if d.watched.Load() == 0 {
		return
	}
	for i := range checks {
		if v, ok := d.keys.Load(checks[i].Key); ok {
			v.(*atomic.Uint64).Add(max(1, checks[i].Hits))
		}
	}
}
