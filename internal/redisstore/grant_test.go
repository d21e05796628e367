package redisstore_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/internal/limit"
	"github.com/ratelimitd/ratelimitd/internal/redisstore"
	"github.com/ratelimitd/ratelimitd/internal/redisstore/redistest"
)

// TestGrantMatchesLimit is grant.lua's differential test: random takes
// and give-backs (in the grant's window, and stale ones), on every
// algorithm, on one scripted clock, against limit.Grant and
// limit.GiveBack; and a decision made after grants sees them consumed,
// read by decide.lua from the same keys.
func TestGrantMatchesLimit(t *testing.T) {
	srv := redistest.Start(t)
	var clock atomic.Int64
	clock.Store(time.Now().UnixMicro())
	s := newStore(t, srv, func() time.Time { return time.UnixMicro(clock.Load()) })
	ctx := context.Background()
	rules := []limit.Check{
		{Limit: 50, WindowUS: 1e6}, {Limit: 200, WindowUS: 60e6},
		{Limit: 30, WindowUS: 10e6, Algorithm: limit.SlidingWindow},
		{Limit: 20, WindowUS: 1e6, Algorithm: limit.TokenBucket}, {Limit: 5, WindowUS: 60e6, Algorithm: limit.TokenBucket, Burst: 12},
	}
	type model struct {
		st    limit.State
		found bool
		end   int64 // window end of the latest take
	}
	models := map[string]*model{}
	rng := rand.New(rand.NewPCG(5, 6))
	var seq uint64
	for i := range 3000 {
		if rng.IntN(8) == 0 {
			clock.Add(rng.Int64N(3e6))
		} else {
			clock.Add(rng.Int64N(50e3))
		}
		now := clock.Load()
		ri := rng.IntN(len(rules))
		c := rules[ri]
		c.Key = fmt.Sprintf("g%d:%d", ri, rng.IntN(2))
		m := models[c.Key]
		if m == nil {
			m = &model{}
			models[c.Key] = m
		}
		op := redisstore.GrantOp{Check: c}
		op.Check.Hits = uint64(rng.IntN(25))
		if rng.IntN(20) == 0 {
			op.Check.Hits = 1 << 40
		}
		var want uint64
		switch r := rng.IntN(6); {
		case r < 2:
			op.GiveBack, op.WindowEndUS = true, m.end
			want = limit.GiveBack(&op.Check, &m.st, m.found, now, m.end, op.Check.Hits)
		case r == 2 && c.Algorithm == limit.FixedWindow:
			// A settle of the latest take's window (perhaps ended), or of
			// whichever is current.
			seq++
			op.Settle, op.Settler, op.Seq, op.WindowEndUS = true, "s", seq, m.end*int64(rng.IntN(2))
			want = limit.Settle(&op.Check, &m.st, m.found, now, op.WindowEndUS, op.Check.Hits)
		default:
			m.end = limit.WindowEnd(now, c.WindowUS)
			want = limit.Grant(&op.Check, &m.st, m.found, now, op.Check.Hits)
		}
		m.found = true
		got, err := s.Grant(ctx, []redisstore.GrantOp{op})
		if err != nil {
			t.Fatal(err)
		}
		// What remains, as limit reports it.
		peek := c
		peek.Hits = 0
		res, exp := make([]limit.Result, 1), make([]int64, 1)
		st := []limit.State{m.st}
		limit.Decide([]limit.Check{peek}, st, []bool{true}, now, res, exp)
		wantEnd := int64(0)
		if c.Algorithm != limit.TokenBucket {
			wantEnd = limit.WindowEnd(now, c.WindowUS)
		}
		if got[0].Hits != want || got[0].Remaining != res[0].Remaining || got[0].ResetUS != res[0].ResetUS || got[0].WindowEndUS != wantEnd {
			t.Fatalf("op %d %+v at %d: redis %+v, limit %d hits, %+v", i, op, now, got[0], want, res[0])
		}
	}
	// Grants are consumed: after taking a counter's whole budget, a
	// request decided by decide.lua is over.
	c := limit.Check{Key: "all", Limit: 10, WindowUS: 3600e6, Hits: 100}
	if g, err := s.Grant(ctx, []redisstore.GrantOp{{Check: c}}); err != nil || g[0].Hits != 10 || g[0].Remaining != 0 {
		t.Fatalf("taking the whole budget: %+v, %v", g, err)
	}
	c.Hits = 1
	if r, err := s.Evaluate(ctx, []limit.Check{c}); err != nil || !r[0].Over {
		t.Errorf("a request after the grant: %+v, %v; want over", r, err)
	}
}

// TestGrantGiveBackOtherWindow: a give-back names the window its hits
// were taken in; in another window it returns nothing, so hits of an
// ended window cannot lower the current one's count.
func TestGrantGiveBackOtherWindow(t *testing.T) {
	srv := redistest.Start(t)
	T := time.Now().Truncate(time.Second).Add(time.Second).UnixMicro()
	var clock atomic.Int64
	clock.Store(T + 500e3)
	s, err := redisstore.New(redisstore.Options{URL: srv.URL(), Timeout: time.Second, ScriptTime: func() time.Time { return time.UnixMicro(clock.Load()) }})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	c := limit.Check{Key: "giveback", Limit: 100, WindowUS: 1e6}
	took, err := s.Grant(context.Background(), []limit.GrantOp{{Check: hitsOf(c, 10)}})
	if err != nil || took[0].Hits != 10 {
		t.Fatalf("take: %+v, %v", took, err)
	}
	clock.Add(1e6) // the next window
	if _, err := s.Evaluate(context.Background(), []limit.Check{hitsOf(c, 30)}); err != nil {
		t.Fatal(err)
	}
	back, err := s.Grant(context.Background(), []limit.GrantOp{{Check: hitsOf(c, 10), GiveBack: true, WindowEndUS: took[0].WindowEndUS}})
	if err != nil || back[0].Hits != 0 || back[0].Remaining != 70 {
		t.Errorf("a give-back naming the ended window: %+v, %v; want nothing given back, 70 remaining", back, err)
	}
	// Naming the current window, it is taken back.
	now, err := s.Grant(context.Background(), []limit.GrantOp{{Check: hitsOf(c, 5)}})
	if err != nil {
		t.Fatal(err)
	}
	back, err = s.Grant(context.Background(), []limit.GrantOp{{Check: hitsOf(c, 5), GiveBack: true, WindowEndUS: now[0].WindowEndUS}})
	if err != nil || back[0].Hits != 5 || back[0].Remaining != 70 {
		t.Errorf("a give-back naming the current window: %+v, %v; want 5 given back, 70 remaining", back, err)
	}
}

func hitsOf(c limit.Check, n uint64) limit.Check {
	c.Hits = n
	return c
}

// TestGrantTreatsForeignValueAsAbsent: a fixed window's key holding the
// current window's end and a count followed by anything but a budget's
// state ("<end>:5xyz": not a value this service writes) counts as absent
// for a grant, as for a decision, and is rewritten clean.
func TestGrantTreatsForeignValueAsAbsent(t *testing.T) {
	srv := redistest.Start(t)
	const T = int64(1_800_000_000_000_000) // a window start of every length below
	s, err := redisstore.New(redisstore.Options{URL: srv.URL(), Timeout: time.Second, ScriptTime: func() time.Time { return time.UnixMicro(T + 5e5) }})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	c := limit.Check{Key: "foreign", Limit: 10, WindowUS: 1e6}
	end := T + 1e6
	rdb := srv.Client()
	for _, v := range []string{fmt.Sprintf("%d:5xyz", end), fmt.Sprintf("%d:5:3", end)} {
		rdb.Set(ctx, c.Key, v, time.Minute)
		took, err := s.Grant(ctx, []limit.GrantOp{{Check: hitsOf(c, 3)}})
		if err != nil || took[0].Hits != 3 || took[0].Remaining != 7 {
			t.Errorf("a take of 3 on %q: %+v, %v; want 3 taken, 7 remaining (the value counts as absent)", v, took, err)
		}
		if got := rdb.Get(ctx, c.Key).Val(); got != fmt.Sprintf("%d:3", end) {
			t.Errorf("after the take on %q the key holds %q, want %q", v, got, fmt.Sprintf("%d:3", end))
		}
	}
}

// TestGrantAcrossClusterSlots: on Cluster, one grant call of ops on
// counters in many slots (a cold draw for many keys, with settles and
// give-backs among them) is one script call per slot, each op answered
// in its place, as one call on one Redis answers them; and two ops of a
// slot run in that slot's call, in order.
func TestGrantAcrossClusterSlots(t *testing.T) {
	_, s := clusterStore(t)
	ctx := context.Background()
	var ops []limit.GrantOp
	for i := range 40 {
		c := limit.Check{Key: fmt.Sprintf("cold:%d", i), Limit: uint64(10 + i), WindowUS: 3600e6}
		ops = append(ops, limit.GrantOp{Check: hitsOf(c, 5)})
	}
	// Two more ops on cold:3, in its slot's call after its take.
	c3 := ops[3].Check
	ops = append(ops, limit.GrantOp{Check: hitsOf(c3, 4)}, limit.GrantOp{Check: hitsOf(c3, 2), Settle: true, Settler: "i", Seq: 1})
	res, err := s.GrantWithin(ctx, ops)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 40 {
		if want := uint64(10 + i - 5); res[i].Hits != 5 || (i != 3 && res[i].Remaining != want) {
			t.Errorf("op %d: %+v, want 5 taken, %d left", i, res[i], want)
		}
	}
	if r := res[40]; r.Hits != 4 || r.Remaining != 13-9 {
		t.Errorf("cold:3's second take: %+v, want 4 taken, 4 left", r)
	}
	if r := res[41]; r.Hits != 2 || r.Remaining != 13-11 {
		t.Errorf("cold:3's settle after its takes: %+v, want 2 settled, 2 left", r)
	}
}
