package persecond

import (
	"context"
	"errors"
	"testing"

	"github.com/ratelimitd/ratelimitd/internal/limit"
	"github.com/ratelimitd/ratelimitd/internal/memstore"
)

// failing fails every call.
type failing struct{}

func (failing) Evaluate(context.Context, []limit.Check) ([]limit.Result, error) {
	return nil, errors.New("down")
}

func used(t *testing.T, st Evaluator, c limit.Check) uint64 {
	t.Helper()
	c.Hits, c.Refund, c.Usage = 0, false, false
	r, err := st.Evaluate(context.Background(), []limit.Check{c})
	if err != nil {
		t.Fatal(err)
	}
	return r[0].Used(c.Limit)
}

// TestAllOrNothingAcrossStores: per-second counters go to their store,
// the rest to the main one; a request rejected by either consumes
// nothing in both, and one whose per-second store fails gives back what
// the main store consumed.
func TestAllOrNothingAcrossStores(t *testing.T) {
	main, fast := memstore.New(memstore.Options{}), memstore.New(memstore.Options{})
	s := &Store{Main: main, PerSecond: fast}
	ctx := context.Background()
	hour := limit.Check{Key: "h", Limit: 100, WindowUS: 3600e6, Hits: 1}
	sec := limit.Check{Key: "s", Limit: 2, WindowUS: Window, Hits: 1}
	for i := range 3 {
		r, err := s.Evaluate(ctx, []limit.Check{hour, sec})
		if err != nil {
			t.Fatal(err)
		}
		if wantOver := i == 2; r[1].Over != wantOver || r[0].Over {
			t.Fatalf("call %d: %+v", i, r)
		}
	}
	// The third call was rejected by the per-second counter: the hourly
	// one gave its hit back.
	if n := used(t, main, hour); n != 2 {
		t.Errorf("hourly counter %d after a rejected request, want 2", n)
	}
	if n := used(t, fast, sec); n != 2 {
		t.Errorf("per-second counter %d, want 2", n)
	}
	if n := used(t, main, sec); n != 0 {
		t.Errorf("the per-second counter reached the main store (%d)", n)
	}
	// Rejected by the main store: the per-second counter is only read.
	tight := limit.Check{Key: "t", Limit: 0, WindowUS: 60e6, Hits: 1}
	other := limit.Check{Key: "s2", Limit: 5, WindowUS: Window, Hits: 1}
	r, err := s.Evaluate(ctx, []limit.Check{tight, other})
	if err != nil || !r[0].Over || r[1].Over {
		t.Fatalf("rejected by the main store: %+v, %v", r, err)
	}
	if n := used(t, fast, other); n != 0 {
		t.Errorf("per-second counter consumed by a rejected request: %d", n)
	}
	// The per-second store down: an error, and the main store's hit
	// given back.
	down := &Store{Main: main, PerSecond: failing{}}
	if _, err := down.Evaluate(ctx, []limit.Check{hour, sec}); err == nil {
		t.Fatal("no error with the per-second store down")
	}
	if n := used(t, main, hour); n != 2 {
		t.Errorf("hourly counter %d after the per-second store failed, want 2", n)
	}
}

// TestGrantRoutes: grants go to the store of their window.
func TestGrantRoutes(t *testing.T) {
	mainSt, fast := memstore.New(memstore.Options{}), memstore.New(memstore.Options{})
	s := &Store{Main: mainSt, PerSecond: fast}
	ops := []limit.GrantOp{
		{Check: limit.Check{Key: "m", Limit: 10, WindowUS: 60e6, Hits: 4}},
		{Check: limit.Check{Key: "f", Limit: 10, WindowUS: Window, Hits: 3}},
	}
	res, err := s.Grant(context.Background(), ops)
	if err != nil || res[0].Hits != 4 || res[1].Hits != 3 {
		t.Fatalf("Grant = %+v, %v", res, err)
	}
	if used(t, mainSt, ops[0].Check) != 4 || used(t, fast, ops[1].Check) != 3 || used(t, fast, ops[0].Check) != 0 {
		t.Error("grants landed in the wrong store")
	}
	if _, err := (&Store{Main: failing{}, PerSecond: fast}).Grant(context.Background(), ops); err == nil {
		t.Error("a store that cannot grant did not fail the grant")
	}
}

// TestUsageAcrossStores: usage charges are recorded in both stores
// whichever rejects: never given back, and charged (not read) in the
// store after the one that rejected.
func TestUsageAcrossStores(t *testing.T) {
	main, fast := memstore.New(memstore.Options{}), memstore.New(memstore.Options{})
	s := &Store{Main: main, PerSecond: fast}
	ctx := context.Background()
	budget := limit.Check{Key: "b", Limit: 1000, WindowUS: 3600e6, Hits: 300, Usage: true, FlightS: 60}
	spent := limit.Check{Key: "x", Limit: 10, WindowUS: Window, Hits: 50, Usage: true, FlightS: 60}
	r, err := s.Evaluate(ctx, []limit.Check{budget, spent})
	if err != nil || r[0].Over || !r[1].Over {
		t.Fatalf("charge crossing the per-second budget: %+v, %v", r, err)
	}
	if n := used(t, main, budget); n != 300 {
		t.Errorf("main budget %d after the per-second store rejected, want 300 kept", n)
	}
	// Rejected by the main store: the per-second charge is still made.
	over := limit.Check{Key: "o", Limit: 100, WindowUS: 3600e6, Hits: 500, Usage: true, FlightS: 60}
	fresh := limit.Check{Key: "y", Limit: 1000, WindowUS: Window, Hits: 7, Usage: true, FlightS: 60}
	if r, err := s.Evaluate(ctx, []limit.Check{over, fresh}); err != nil || !r[0].Over || r[1].Over || r[1].Remaining != 993 {
		t.Fatalf("rejected by the main store: %+v, %v", r, err)
	}
	if n := used(t, fast, fresh); n != 7 {
		t.Errorf("per-second charge %d after the main store rejected, want 7", n)
	}
}
