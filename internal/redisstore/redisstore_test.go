package redisstore_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/internal/limit"
	"github.com/ratelimitd/ratelimitd/internal/memstore"
	"github.com/ratelimitd/ratelimitd/internal/redisstore"
	"github.com/ratelimitd/ratelimitd/internal/redistest"
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
		if _, err := redisstore.New(redisstore.Options{URL: u}); err == nil || !strings.Contains(err.Error(), "--redis-url") {
			t.Errorf("New(%q) error = %v, want a --redis-url error", u, err)
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
	if r[0].Count != 1 || r[1].Count != 1 {
		t.Errorf("counts = %d,%d, want 1,1: the requests b rejected must not consume a", r[0].Count, r[1].Count)
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
	if r[0].Over || r[0].Count != 1 {
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

func TestRefund(t *testing.T) {
	srv := redistest.Start(t)
	s := newStore(t, srv, nil)
	ctx := context.Background()
	c := limit.Check{Key: "r", Limit: 5, WindowUS: 60e6, Hits: 3}
	s.Evaluate(ctx, []limit.Check{c})
	c.Refund, c.Hits = true, 2
	r, _ := s.Evaluate(ctx, []limit.Check{c})
	if r[0].Count != 1 || r[0].Over {
		t.Errorf("after refund of 2: %+v, want count 1", r[0])
	}
	c.Hits = 100
	r, _ = s.Evaluate(ctx, []limit.Check{c})
	if r[0].Count != 0 {
		t.Errorf("refund below zero: count %d", r[0].Count)
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

// TestMatchesMemstore feeds the same random traffic, on the same scripted
// clock, to the Lua script and to memstore, and requires identical results.
func TestMatchesMemstore(t *testing.T) {
	srv := redistest.Start(t)
	var clock atomic.Int64
	clock.Store(time.Now().UnixMicro())
	now := func() time.Time { return time.UnixMicro(clock.Load()) }
	rs := newStore(t, srv, now)
	ms := memstore.New(memstore.Options{Now: now})
	rng := rand.New(rand.NewPCG(1, 2))
	windows := []int64{1e6, 60e6, 3600e6}
	ctx := context.Background()
	for i := 0; i < 4000; i++ {
		if rng.IntN(10) == 0 {
			clock.Add(rng.Int64N(3e6)) // gaps, sometimes across windows
		}
		n := 1 + rng.IntN(3)
		checks := make([]limit.Check, n)
		for j := range checks {
			w := rng.IntN(len(windows))
			checks[j] = limit.Check{
				Key:      fmt.Sprintf("k%d:%d", w, rng.IntN(5)),
				Limit:    uint64(rng.IntN(12)),
				WindowUS: windows[w],
				Hits:     uint64(rng.IntN(4)),
				Refund:   rng.IntN(15) == 0,
				NoVeto:   rng.IntN(10) == 0,
			}
			// One key, one window: a key never mixes windows in production.
			checks[j].Key += fmt.Sprintf("|%d", checks[j].WindowUS)
		}
		seen := map[string]bool{}
		uniq := checks[:0]
		for _, c := range checks {
			if !seen[c.Key] { // the service merges duplicate keys before a store sees them
				seen[c.Key] = true
				uniq = append(uniq, c)
			}
		}
		checks = uniq
		got, err := rs.Evaluate(ctx, checks)
		if err != nil {
			t.Fatal(err)
		}
		want, _ := ms.Evaluate(ctx, checks)
		for j := range want {
			if got[j] != want[j] {
				t.Fatalf("request %d check %d %+v: redis %+v, memstore %+v", i, j, checks[j], got[j], want[j])
			}
		}
	}
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
