package redisstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/internal/limit"
	"github.com/ratelimitd/ratelimitd/internal/redisstore/redistest"
)

// TestKeyTTLsCoverTheState checks how long each algorithm's key lives, on
// Redis's own clock (production's: no scripted time), against what its
// state must still decide. A key that expires early forgets hits: a
// sliding window's count is the next window's weighted Prev, so after one
// hit its PTTL covers the rest of the window plus one whole window; a
// token bucket drained of its burst is full again only at its arrival
// time, so its PTTL covers that.
func TestKeyTTLsCoverTheState(t *testing.T) {
	srv := redistest.Start(t)
	s := newStore(t, srv, nil)
	rdb := srv.Client()
	ctx := context.Background()
	redisNow := func() time.Time {
		now, err := rdb.Time(ctx).Result()
		if err != nil {
			t.Fatal(err)
		}
		return now
	}
	const window = 10 * time.Second
	before := redisNow()
	if _, err := s.Evaluate(ctx, []limit.Check{{Key: "sliding", Limit: 5, WindowUS: window.Microseconds(), Hits: 1, Algorithm: limit.SlidingWindow}}); err != nil {
		t.Fatal(err)
	}
	pttl := rdb.PTTL(ctx, "sliding").Val()
	after := redisNow()
	// The window holding the hit ends at the next multiple of 10 s after
	// "before" at the latest; the key must outlive the one after it.
	end := time.UnixMicro(limit.WindowEnd(before.UnixMicro(), window.Microseconds()))
	if want := end.Add(window).Sub(after); pttl < want {
		t.Errorf("sliding window key PTTL %v, want at least %v (the rest of the window, then one whole window)", pttl, want)
	}

	// 10 a minute, burst 10: one arrival every 6 s; draining the bucket
	// puts its arrival time 60 s ahead.
	bucket := limit.Check{Key: "bucket", Limit: 10, WindowUS: 60e6, Hits: 10, Algorithm: limit.TokenBucket}
	before = redisNow()
	r, err := s.Evaluate(ctx, []limit.Check{bucket})
	if err != nil || r[0].Over || r[0].Remaining != 0 {
		t.Fatalf("draining the bucket: %+v, %v", r, err)
	}
	pttl = rdb.PTTL(ctx, "bucket").Val()
	after = redisNow()
	if want := before.Add(time.Minute).Sub(after); pttl < want {
		t.Errorf("drained token bucket key PTTL %v, want at least %v (until the bucket is full again)", pttl, want)
	}
	// And what that TTL protects: the bucket stays drained.
	bucket.Hits = 1
	if r, err := s.Evaluate(ctx, []limit.Check{bucket}); err != nil || !r[0].Over {
		t.Errorf("a drained bucket admitted a hit: %+v, %v", r, err)
	}
}
