package redisstore_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/internal/limit"
	"github.com/ratelimitd/ratelimitd/internal/redisstore"
	"github.com/ratelimitd/ratelimitd/internal/redisstore/redistest"
)

func newStore(t *testing.T, srv *redistest.Server, now func() time.Time) *redisstore.Store {
	t.Helper()
	s, err := redisstore.New(redisstore.Options{URL: srv.URL(), Timeout: time.Second, ScriptTime: now})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func TestBadURL(t *testing.T) {
	for _, u := range []string{"http://x", "redis://h:notaport", "://"} {
		if _, err := redisstore.New(redisstore.Options{URL: u}); err == nil || !strings.Contains(err.Error(), "parse the URL") {
			t.Errorf("New(%q) error = %v, want a URL error", u, err)
		}
	}
	for _, u := range []string{"redis://127.0.0.1:1/0", "rediss://u:p@127.0.0.1:1", "unix:///tmp/nowhere.sock"} {
		s, err := redisstore.New(redisstore.Options{URL: u})
		if err != nil {
			t.Errorf("New(%q) = %v", u, err)
			continue
		}
		s.Close()
	}
}

func TestAllOrNothingAndTTL(t *testing.T) {
	srv := redistest.Start(t)
	s := newStore(t, srv, nil)
	rdb := srv.Client()
	ctx := context.Background()
	checks := []limit.Check{
		{Key: "a", Limit: 10, WindowUS: 3600e6, Hits: 1},
		{Key: "b", Limit: 1, WindowUS: 3600e6, Hits: 1},
	}
	for i := 0; i < 3; i++ {
		if _, err := s.Evaluate(ctx, checks); err != nil {
			t.Fatal(err)
		}
	}
	r, err := s.Evaluate(ctx, []limit.Check{{Key: "a", Limit: 10, WindowUS: 3600e6}, {Key: "b", Limit: 1, WindowUS: 3600e6}})
	if err != nil {
		t.Fatal(err)
	}
	if r[0].Used(10) != 1 || r[1].Used(1) != 1 {
		t.Errorf("counts = %d,%d, want 1,1: the requests b rejected must not consume a", r[0].Used(10), r[1].Used(1))
	}
	if r[0].ResetUS <= 0 || r[0].ResetUS > 3600e6 {
		t.Errorf("reset = %d", r[0].ResetUS)
	}
	for _, k := range []string{"a", "b"} {
		if ttl := rdb.PTTL(ctx, k).Val(); ttl <= 0 {
			t.Errorf("key %s ttl = %v", k, ttl)
		}
	}
}

func TestHealsKeyWithoutTTL(t *testing.T) {
	srv := redistest.Start(t)
	s := newStore(t, srv, nil)
	rdb := srv.Client()
	ctx := context.Background()
	// The article's lab: a worker died between INCR and EXPIRE, leaving 44
	// with no TTL, and the user was blocked forever.
	rdb.Set(ctx, "leaked", "44", 0)
	rdb.Set(ctx, "leaked2", "44", 0)
	r, err := s.Evaluate(ctx, []limit.Check{{Key: "leaked", Limit: 10, WindowUS: 60e6, Hits: 1}})
	if err != nil {
		t.Fatal(err)
	}
	if r[0].Over || r[0].Used(10) != 1 {
		t.Errorf("leaked key decision = %+v, want OK with count 1", r[0])
	}
	if ttl := rdb.PTTL(ctx, "leaked").Val(); ttl <= 0 || ttl > time.Minute+time.Second {
		t.Errorf("ttl after heal = %v", ttl)
	}
	// A request rejected elsewhere still heals: the stale key is removed.
	if _, err := s.Evaluate(ctx, []limit.Check{{Key: "leaked2", Limit: 10, WindowUS: 60e6, Hits: 1}, {Key: "zero", Limit: 0, WindowUS: 60e6, Hits: 1}}); err != nil {
		t.Fatal(err)
	}
	if ttl := rdb.PTTL(ctx, "leaked2").Val(); ttl == -1 {
		t.Error("leaked2 still has no TTL")
	}
}

// TestRefund: a refund gives hits back, and never below zero: a refund
// larger than the count leaves a count of 0 (Remaining is the whole
// limit, and the next hit leaves limit-1), not a negative count that a
// later read would take for something else.
func TestRefund(t *testing.T) {
	srv := redistest.Start(t)
	s := newStore(t, srv, nil)
	ctx := context.Background()
	eval := func(c limit.Check) limit.Result {
		t.Helper()
		r, err := s.Evaluate(ctx, []limit.Check{c})
		if err != nil {
			t.Fatal(err)
		}
		return r[0]
	}
	for _, algo := range []limit.Algorithm{limit.FixedWindow, limit.SlidingWindow, limit.TokenBucket} {
		key := fmt.Sprint("r", algo)
		c := limit.Check{Key: key, Limit: 5, WindowUS: 3600e6, Hits: 3, Algorithm: algo}
		eval(c)
		c.Refund, c.Hits = true, 2
		if r := eval(c); r.Remaining != 4 || r.Over {
			t.Errorf("%v: after a refund of 2 of 3: %+v, want 4 remaining", algo, r)
		}
		c.Hits = 100
		if r := eval(c); r.Remaining != 5 {
			t.Errorf("%v: after a refund of 100 of 1: %+v, want exactly 5 remaining (count 0)", algo, r)
		}
		if v, err := srv.Client().Get(ctx, key).Result(); err == nil && strings.Contains(v, "-") {
			t.Errorf("%v: stored %q after a refund below zero", algo, v)
		}
		c.Refund, c.Hits = false, 1
		if r := eval(c); r.Remaining != 4 {
			t.Errorf("%v: a hit after refunding to zero: %+v, want 4 remaining", algo, r)
		}
	}
}

func TestNoScriptReload(t *testing.T) {
	srv := redistest.Start(t)
	s := newStore(t, srv, nil)
	ctx := context.Background()
	if err := s.Ping(ctx); err != nil {
		t.Fatal(err)
	}
	srv.Client().ScriptFlush(ctx)
	r, err := s.Evaluate(ctx, []limit.Check{{Key: "k", Limit: 1, WindowUS: 1e6, Hits: 1}})
	if err != nil || r[0].Over {
		t.Fatalf("after SCRIPT FLUSH: %+v, %v", r, err)
	}
	if s.ScriptReloads() != 1 {
		t.Errorf("reloads = %d, want 1", s.ScriptReloads())
	}
}

func TestUnavailable(t *testing.T) {
	srv := redistest.Start(t)
	s := newStore(t, srv, nil)
	srv.Kill()
	start := time.Now()
	_, err := s.Evaluate(context.Background(), []limit.Check{{Key: "k", Limit: 1, WindowUS: 1e6, Hits: 1}})
	if err == nil || !strings.Contains(err.Error(), "redisstore: eval decide (1 keys, connection)") || !errors.Is(err, redisstore.ErrUnavailable) {
		t.Fatalf("err = %v", err)
	}
	if el := time.Since(start); el > 2*time.Second {
		t.Errorf("took %v with Redis down", el)
	}
}

// TestMatchesMemstore is the differential test: the same random traffic,
// on the same scripted clock, to the Lua script and to memstore (the Go
// definition in limit.Decide), every algorithm mixed in one request, with
// bursts, gaps across windows, hits above 1, peeks, refunds and shadow
// counters, and hits up to what 64 descriptors of 2^32-1 on one counter
// sum to. Every decision must be identical.
func TestMatchesMemstore(t *testing.T) {
	rs, ms, clock := twoStores(t)
	rng := rand.New(rand.NewPCG(1, 2))
	type rule struct {
		algo     limit.Algorithm
		windowUS int64
		limit    uint64
		burst    uint64
	}
	rules := []rule{
		{limit.FixedWindow, 1e6, 5, 0}, {limit.FixedWindow, 60e6, 11, 0}, {limit.FixedWindow, 300e6, 0, 0},
		{limit.FixedWindow, 3600e6, 1 << 40, 0}, {limit.FixedWindow, 60e6, limit.MaxLimit, 0},
		{limit.SlidingWindow, 1e6, 7, 0}, {limit.SlidingWindow, 10e6, 20, 0}, {limit.SlidingWindow, 3600e6, 3, 0},
		{limit.TokenBucket, 1e6, 10, 0}, {limit.TokenBucket, 1e6, 3, 8}, {limit.TokenBucket, 60e6, 7, 2}, {limit.TokenBucket, 5e6, 0, 0},
	}
	const requests = 6000
	counts := map[limit.Algorithm]int{}
	usage := 0
	for i := range requests {
		switch r := rng.IntN(20); {
		case r == 0:
			clock.Add(rng.Int64N(15e6)) // a gap, often across windows
		case r < 8:
			clock.Add(rng.Int64N(200e3))
		}
		n := 1 + rng.IntN(3)
		checks := make([]limit.Check, 0, n)
		seen := map[string]bool{}
		for range n {
			ri := rng.IntN(len(rules))
			ru := rules[ri]
			key := fmt.Sprintf("r%d:%d", ri, rng.IntN(3))
			if seen[key] { // the service merges duplicate keys before a store sees them
				continue
			}
			seen[key] = true
			hits := uint64(rng.IntN(3))
			switch rng.IntN(40) {
			case 0, 1, 2, 3:
				hits = uint64(rng.IntN(12))
			case 4:
				// What a request can carry: up to 2^51-1 per descriptor,
				// summed over up to 64 descriptors of one counter.
				hits = []uint64{math.MaxUint32, limit.MaxHits, 9 * math.MaxUint32, 64 * math.MaxUint32, 1 << 33,
					1 << 39, limit.MaxLimit, 64 * limit.MaxLimit, 1<<32 - 1, 1 << 32}[rng.IntN(10)]
			}
			c := limit.Check{
				Key: key, Limit: ru.limit, WindowUS: ru.windowUS, Hits: hits,
				Refund: rng.IntN(15) == 0, NoVeto: rng.IntN(10) == 0,
				Algorithm: ru.algo, Burst: ru.burst,
			}
			if !c.Refund && rng.IntN(3) == 0 {
				// Usage: charges recorded past the limit, budget checks
				// (no hits) admitted against the flights, which expire
				// within the gaps above.
				c.Usage, c.FlightS = true, 1+rng.Int64N(20)
				if rng.IntN(2) == 0 {
					c.Hits = 0
				}
				// Every kind of usage call: by its hits, a zero charge, a
				// cost check, a request stating no hits.
				c.Kind = limit.UsageKind(rng.IntN(4))
				usage++
			}
			checks = append(checks, c)
			counts[ru.algo]++
		}
		mustMatch(t, rs, ms, checks, i, clock)
	}
	t.Logf("%d requests identical: %d fixed-window, %d sliding-window, %d token-bucket checks (%d of them usage)",
		requests, counts[limit.FixedWindow], counts[limit.SlidingWindow], counts[limit.TokenBucket], usage)
}

func TestConcurrentExactlyTheLimit(t *testing.T) {
	srv := redistest.Start(t)
	s := newStore(t, srv, nil)
	var ok atomic.Int64
	var wg sync.WaitGroup
	for g := 0; g < 64; g++ {
		wg.Go(func() {
			for i := 0; i < 100; i++ {
				r, err := s.Evaluate(context.Background(), []limit.Check{{Key: "hot", Limit: 100, WindowUS: 3600e6, Hits: 1}})
				if err == nil && !r[0].Over {
					ok.Add(1)
				}
			}
		})
	}
	wg.Wait()
	if ok.Load() != 100 {
		t.Errorf("admitted %d, want 100", ok.Load())
	}
}

// TestTimelines runs each algorithm on a scripted clock in Redis: the
// same timelines internal/limit pins in Go.
func TestTimelines(t *testing.T) {
	srv := redistest.Start(t)
	var clock atomic.Int64
	clock.Store(1000e6)
	s := newStore(t, srv, func() time.Time { return time.UnixMicro(clock.Load()) })
	ctx := context.Background()
	at := func(us int64, c limit.Check) limit.Result {
		t.Helper()
		clock.Store(us)
		r, err := s.Evaluate(ctx, []limit.Check{c})
		if err != nil {
			t.Fatal(err)
		}
		return r[0]
	}
	// Sliding window, 10 per 10 s: 10 hits at 9 s weigh on the next window.
	sw := limit.Check{Key: "sw", Limit: 10, WindowUS: 10e6, Algorithm: limit.SlidingWindow, Hits: 10}
	if r := at(1009e6, sw); r.Over || r.Remaining != 0 {
		t.Fatalf("sliding, 10 at 9 s: %+v", r)
	}
	sw.Hits = 1
	for _, step := range []struct {
		us       int64
		wantOver bool
		wantRem  uint64
	}{
		{1010e6, true, 0},  // the previous 10 weigh 100 %
		{1012e6, false, 1}, // 80 %: 8 + 1
		{1012e6, false, 0}, // 8 + 2
		{1012e6, true, 0},
		{1015e6, false, 2}, // 50 %: the previous 10 weigh 5; 5 + 2 + 1 = 8
	} {
		if r := at(step.us, sw); r.Over != step.wantOver || r.Remaining != step.wantRem {
			t.Errorf("sliding at %d µs: %+v, want over=%v remaining=%d", step.us, r, step.wantOver, step.wantRem)
		}
	}
	// Token bucket, 10 a second (a token each 100 ms), burst 5.
	tb := limit.Check{Key: "tb", Limit: 10, WindowUS: 1e6, Algorithm: limit.TokenBucket, Burst: 5, Hits: 1}
	for i := range 5 {
		if r := at(2000e6, tb); r.Over || r.Remaining != uint64(4-i) {
			t.Fatalf("bucket hit %d: %+v", i, r)
		}
	}
	if r := at(2000e6, tb); !r.Over || r.ResetUS != 100e3 {
		t.Errorf("6th: %+v, want over, next in 100 ms", r)
	}
	if r := at(2000.1e6, tb); r.Over {
		t.Errorf("after 100 ms: %+v", r)
	}
	if ttl := srv.Client().PTTL(ctx, "tb").Val(); ttl <= 0 {
		t.Errorf("bucket key TTL %v", ttl)
	}
	if r := at(2010e6, tb); r.Remaining != 4 {
		t.Errorf("after 10 s idle: %+v, want a full bucket less one", r)
	}
}

// TestLargeCall decides a call with more keys than the script reads with
// one MGET (it then reads key by key): same decisions, and a key of
// another type is healed there too.
func TestLargeCall(t *testing.T) {
	srv := redistest.Start(t)
	s := newStore(t, srv, nil)
	rdb := srv.Client()
	ctx := context.Background()
	rdb.RPush(ctx, "big:7", "x")
	checks := make([]limit.Check, 1500)
	for i := range checks {
		checks[i] = limit.Check{Key: fmt.Sprint("big:", i), Limit: 5, WindowUS: 3600e6, Hits: 1}
	}
	for round := 1; round <= 2; round++ {
		r, err := s.Evaluate(ctx, checks)
		if err != nil {
			t.Fatal(err)
		}
		for i, x := range r {
			if x.Over || x.Remaining != uint64(5-round) {
				t.Fatalf("round %d key %d: %+v, want remaining %d", round, i, x, 5-round)
			}
		}
	}
	if typ := rdb.Type(ctx, "big:7").Val(); typ != "string" || rdb.PTTL(ctx, "big:7").Val() <= 0 {
		t.Errorf("key of another type: %s, TTL %v", typ, rdb.PTTL(ctx, "big:7").Val())
	}
}

// TestManyRules decides one call whose keys all have different limits
// (request overrides can do that): each key is decided by its own.
func TestManyRules(t *testing.T) {
	srv := redistest.Start(t)
	s := newStore(t, srv, nil)
	checks := make([]limit.Check, 40)
	for i := range checks {
		checks[i] = limit.Check{Key: fmt.Sprint("rules:", i), Limit: uint64(i + 1), WindowUS: 3600e6, Hits: 1,
			Algorithm: limit.Algorithm(i % 3)}
	}
	r, err := s.Evaluate(context.Background(), checks)
	if err != nil {
		t.Fatal(err)
	}
	for i, x := range r {
		if x.Over || x.Remaining != uint64(i) {
			t.Errorf("key %d (limit %d): %+v, want remaining %d", i, i+1, x, i)
		}
	}
}
