package memstore

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/internal/limit"
)

func TestWindowResets(t *testing.T) {
	now := time.UnixMicro(1_000_000_000 * 1e6)
	s := New(Options{Now: func() time.Time { return now }})
	c := []limit.Check{{Key: "k", Limit: 2, WindowUS: 60e6, Hits: 1}}
	for i, wantOver := range []bool{false, false, true} {
		r, _ := s.Evaluate(context.Background(), c)
		if r[0].Over != wantOver {
			t.Fatalf("call %d over=%v", i, r[0].Over)
		}
		if r[0].ResetUS != 20e6 {
			t.Fatalf("reset = %d, want 20s (window aligned to the minute)", r[0].ResetUS)
		}
	}
	now = now.Add(20 * time.Second)
	r, _ := s.Evaluate(context.Background(), c)
	if r[0].Over || r[0].Remaining != 1 {
		t.Fatalf("new window: %+v", r[0])
	}
	now = now.Add(5 * time.Minute)
	s.Evaluate(context.Background(), []limit.Check{{Key: "other", Limit: 1, WindowUS: 1e6, Hits: 1}})
	if s.Len() != 1 {
		t.Errorf("expired counter kept: %d live", s.Len())
	}
}

func TestConcurrentExact(t *testing.T) {
	s := New(Options{})
	var ok atomic.Int64
	var wg sync.WaitGroup
	for g := 0; g < 64; g++ {
		wg.Go(func() {
			for i := 0; i < 200; i++ {
				r, _ := s.Evaluate(context.Background(), []limit.Check{
					{Key: "a", Limit: 100, WindowUS: 3600e6, Hits: 1},
					{Key: "b", Limit: 1000, WindowUS: 3600e6, Hits: 1},
				})
				if !r[0].Over && !r[1].Over {
					ok.Add(1)
				}
			}
		})
	}
	wg.Wait()
	if ok.Load() != 100 {
		t.Errorf("admitted %d, want 100", ok.Load())
	}
	r, _ := s.Evaluate(context.Background(), []limit.Check{{Key: "b", Limit: 1000, WindowUS: 3600e6}})
	if r[0].Used(1000) != 100 {
		t.Errorf("b consumed %d, want 100 (rejected requests consume nothing)", r[0].Used(1000))
	}
}

// TestGrant: a grant consumes what requests would, a give-back returns
// it only within the grant's window, and requests see both.
func TestGrant(t *testing.T) {
	now := time.UnixMicro(1_000_000_000_000)
	s := New(Options{Now: func() time.Time { return now }})
	ctx := context.Background()
	c := limit.Check{Key: "k", Limit: 100, WindowUS: 60e6}
	take := c
	take.Hits = 30
	r, err := s.Grant(ctx, []limit.GrantOp{{Check: take}})
	if err != nil || r[0].Hits != 30 || r[0].Remaining != 70 || r[0].WindowEndUS != 1_000_020_000_000 || r[0].ResetUS != 20e6 {
		t.Fatalf("take 30 = %+v, %v", r, err)
	}
	req := c
	req.Hits = 1
	if res, _ := s.Evaluate(ctx, []limit.Check{req}); res[0].Over || res[0].Remaining != 69 {
		t.Fatalf("request after the grant = %+v, want 69 remaining", res[0])
	}
	back := c
	back.Hits = 10
	r, _ = s.Grant(ctx, []limit.GrantOp{{Check: back, GiveBack: true, WindowEndUS: r[0].WindowEndUS - 60e6}})
	if r[0].Hits != 0 {
		t.Fatalf("give-back naming another window returned %d", r[0].Hits)
	}
	r, _ = s.Grant(ctx, []limit.GrantOp{{Check: back, GiveBack: true, WindowEndUS: 1_000_020_000_000}})
	if r[0].Hits != 10 || r[0].Remaining != 79 {
		t.Fatalf("give-back = %+v, want 10 back, 79 remaining", r[0])
	}
	take.Hits = 500
	if r, _ = s.Grant(ctx, []limit.GrantOp{{Check: take}}); r[0].Hits != 79 || r[0].Remaining != 0 {
		t.Fatalf("take past the limit = %+v, want the 79 left", r[0])
	}
	now = now.Add(20 * time.Second) // the next window
	if r, _ = s.Grant(ctx, []limit.GrantOp{{Check: take}}); r[0].Hits != 100 {
		t.Fatalf("take in the next window = %+v, want 100", r[0])
	}
}
