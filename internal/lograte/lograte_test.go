package lograte

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestLimiter: the first line goes, the next within the interval does
// not, one at the interval's end does; keys are apart.
func TestLimiter(t *testing.T) {
	var l Limiter
	t0 := time.Unix(1_800_000_000, 0)
	for _, c := range []struct {
		at   time.Duration
		want bool
	}{{0, true}, {time.Millisecond, false}, {999 * time.Millisecond, false}, {time.Second, true}, {1500 * time.Millisecond, false}, {3 * time.Second, true}} {
		if got := l.Allow(t0.Add(c.at), time.Second); got != c.want {
			t.Errorf("at +%v: %v, want %v", c.at, got, c.want)
		}
	}
	var k Keyed
	if !k.Allow("a", t0, time.Minute) || !k.Allow("b", t0, time.Minute) || k.Allow("a", t0.Add(time.Second), time.Minute) {
		t.Error("keys share a turn, or a key logs twice in its interval")
	}
}

// TestLimiterRace: of many callers at the same moment, one line goes.
func TestLimiterRace(t *testing.T) {
	var l Limiter
	now := time.Unix(1_800_000_000, 0)
	var n atomic.Int64
	var wg sync.WaitGroup
	for range 64 {
		wg.Go(func() {
			if l.Allow(now, time.Second) {
				n.Add(1)
			}
		})
	}
	wg.Wait()
	if n.Load() != 1 {
		t.Errorf("%d lines let through at one moment, want 1", n.Load())
	}
}
