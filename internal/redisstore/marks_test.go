package redisstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/internal/limit"
	"github.com/ratelimitd/ratelimitd/internal/redisstore/redistest"
)

// TestMarkedChargesCountOnce: a usage charge that carries a mark is
// recorded once however often it is sent (a resend, a re-application
// after a failover): sent again, it is answered from the counter as it
// stands, neither counted nor taught; another mark counts. The marks key
// lives a window and the grace at most; a plain call writes none.
func TestMarkedChargesCountOnce(t *testing.T) {
	srv := redistest.Start(t)
	s := newStore(t, srv, nil)
	ctx := context.Background()
	const marks = "{spend}|charged|i|1"
	charge := func(off, hits uint64) limit.Result {
		t.Helper()
		c := limit.Check{Key: "spend", Limit: 1000, WindowUS: 3600e6, Hits: hits, Usage: true, FlightS: 300, MarkKey: marks, MarkOff: off}
		res, err := s.Evaluate(ctx, []limit.Check{c})
		if err != nil {
			t.Fatal(err)
		}
		return res[0]
	}
	if r := charge(3, 100); r.Remaining != 900 {
		t.Fatalf("a first charge of 100: remaining %d, want 900", r.Remaining)
	}
	before, _ := srv.Client().Get(ctx, "spend").Result()
	for range 3 {
		if r := charge(3, 100); r.Remaining != 900 || r.Over {
			t.Errorf("the same charge sent again: %+v, want answered with 900 remaining, not counted", r)
		}
	}
	if after, _ := srv.Client().Get(ctx, "spend").Result(); after != before {
		t.Errorf("the same charge sent again changed the counter: %q, was %q", after, before)
	}
	if r := charge(4, 50); r.Remaining != 850 {
		t.Errorf("another charge (bit 4) of 50: remaining %d, want 850", r.Remaining)
	}
	ttl := srv.Client().PTTL(ctx, marks).Val()
	if ttl <= 0 || ttl > time.Hour+time.Duration(limit.GraceUS)*time.Microsecond {
		t.Errorf("the marks key's TTL: %v, want set, at most a window and the grace", ttl)
	}
	plain := limit.Check{Key: "plain", Limit: 1000, WindowUS: 3600e6, Hits: 5, Usage: true, FlightS: 300}
	if _, err := s.Evaluate(ctx, []limit.Check{plain}); err != nil {
		t.Fatal(err)
	}
	if keys := srv.Client().Keys(ctx, "*charged*").Val(); len(keys) != 1 {
		t.Errorf("marks keys: %v, want only %s (a charge without a mark writes none)", keys, marks)
	}
}
