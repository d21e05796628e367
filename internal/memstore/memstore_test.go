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
