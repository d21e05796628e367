package redisstore

import (
	"context"
	"strconv"
	"sync"
	"time"

	"github.com/ratelimitd/ratelimitd/internal/limit"
)

// The results of seed.lua, per counter.
const (
	seedLeft    = 0 // a state of this window was there
	seedCarried = 1 // started from the incumbent's count
	seedAbsent  = 2 // the incumbent has no count of this window
	seedBad     = 3 // the incumbent's key holds no count: ignored
)

// maxSeeded bounds the counters remembered as seeded; past it the memory
// starts over (a counter asked again is left alone by the script).
const maxSeeded = 1 << 20

// seeded remembers, per counter key, the end of the window this store
// has asked seed.lua about, so that a counter costs one more round trip
// a window, not one a request.
type seeded struct {
	mu  sync.Mutex
	end map[string]int64
}

// due reports whether key's window ending at end still needs asking.
func (sd *seeded) due(key string, end int64) bool {
	sd.mu.Lock()
	defer sd.mu.Unlock()
	return sd.end[key] != end
}

// done records keys as asked about in the windows ending at ends.
func (sd *seeded) done(keys []string, ends []int64, now int64) {
	sd.mu.Lock()
	defer sd.mu.Unlock()
	if sd.end == nil || len(sd.end)+len(keys) > maxSeeded {
		// Past windows first; all of it when that is not enough.
		for k, e := range sd.end {
			if e <= now {
				delete(sd.end, k)
			}
		}
		if sd.end == nil || len(sd.end)+len(keys) > maxSeeded {
			sd.end = make(map[string]int64)
		}
	}
	for i, k := range keys {
		sd.end[k] = ends[i]
	}
}

// seed runs seed.lua for the checks carrying an incumbent key whose
// counter this store has not asked about in its current window. A failure
// is logged and left: the decision that follows does not wait on it, and
// the counter is asked about again on its next request.
func (s *Store) seed(ctx context.Context, checks []limit.Check) {
	now := s.scriptNow()
	var keys, windows, bases []string
	var ends []int64
	for i := range checks {
		c := &checks[i]
		if c.Incumbent == "" || c.Algorithm != limit.FixedWindow || c.Calendar != limit.NoCalendar || c.Lease {
			continue
		}
		end := limit.WindowEnd(now, c.WindowUS)
		if !s.seeded.due(c.Key, end) {
			continue
		}
		keys, ends = append(keys, c.Key), append(ends, end)
		windows, bases = append(windows, strconv.FormatInt(c.WindowUS, 10)), append(bases, c.Incumbent)
	}
	if len(keys) == 0 {
		return
	}
	args := make([]any, 0, 1+2*len(keys))
	args = append(args, s.nowArg())
	for _, w := range windows {
		args = append(args, w)
	}
	for _, b := range bases {
		args = append(args, b)
	}
	res, err := s.seedScript.Run(ctx, s.client, keys, args...).Int64Slice()
	if err != nil {
		s.log.Warn("carrying envoyproxy/ratelimit's counts: the seed script failed; asked again on the next request", "error", err)
		return
	}
	for _, r := range res {
		switch r {
		case seedCarried:
			s.m.IncumbentCount("carried")
		case seedBad:
			s.m.IncumbentCount("not_a_count")
		}
	}
	s.seeded.done(keys, ends, now)
}

// scriptNow is the store's idea of now in µs, for remembering windows: the
// scripted clock in tests, else this process's.
func (s *Store) scriptNow() int64 {
	if s.now != nil {
		return s.now().UnixMicro()
	}
	return time.Now().UnixMicro()
}
