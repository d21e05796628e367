package lease

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/internal/limit"
	"github.com/ratelimitd/ratelimitd/internal/redisstore/redistest"
)

// Tests on a scripted clock use minute windows: Redis still expires a
// key on its own clock, by the TTL the script set from the scripted one,
// and a second's window key could expire while a slow machine counts its
// window (1,014 admitted of 1,000 once under STARVE=2).

// driftLeases is a store with leases on two scripted clocks: Redis's
// (redis) and this process's (local = redis - lag, both in µs), its
// refiller stopped. A test moves them apart to build clock drift, and
// its passes run by hand.
func driftLeases(t *testing.T, srv *redistest.Server, startUS int64) (s *Store, redis, lag *atomic.Int64) {
	t.Helper()
	redis, lag = new(atomic.Int64), new(atomic.Int64)
	redis.Store(startUS)
	s, _ = leaseStore(t, srv, 100*time.Millisecond, func() time.Time { return time.UnixMicro(redis.Load()) })
	manual(s)
	s.leases.now = func() time.Time { return time.UnixMicro(redis.Load() - lag.Load()) }
	return s, redis, lag
}

// admitOne asks for one hit of c and says whether it was admitted.
func admitOne(t *testing.T, s *Store, c limit.Check) bool {
	t.Helper()
	r, err := s.Evaluate(context.Background(), []limit.Check{c})
	if err != nil {
		t.Fatal(err)
	}
	return !r[0].Over
}

// grantThenSpend takes a grant of c's counter and spends it locally
// until keep hits are left; it fails the test if no grant was taken.
func grantThenSpend(t *testing.T, s *Store, c limit.Check, keep uint64) {
	t.Helper()
	admitOne(t, s, c) // the counter is known
	g := s.leases.entries[c.Key]
	g.Rate = 5000
	s.leases.pass(false)
	if g.avail <= keep {
		t.Fatalf("a grant of %d, want more than %d", g.avail, keep)
	}
	for g.avail > keep {
		if !admitOne(t, s, c) {
			t.Fatal("a hit of the grant refused")
		}
	}
}

// window counts what the window admits from now on, up to 3 × the limit
// asked.
func window(t *testing.T, s *Store, c limit.Check) int {
	t.Helper()
	n := 0
	for range 3 * c.Limit {
		if admitOne(t, s, c) {
			n++
		}
	}
	return n
}

// TestLeaseMarginCoversDrift: this process's clock falls 1 ms behind
// Redis's during a window. Its grant must stop being used before the
// window ends on its own clock, by the margin: used up to the very end,
// its last hits land in Redis's next window, which then admits more than
// its limit.
func TestLeaseMarginCoversDrift(t *testing.T) {
	srv := redistest.Start(t)
	T := time.Now().Truncate(time.Minute).Add(time.Minute).UnixMicro() // a window start
	s, redis, lag := driftLeases(t, srv, T+59_800e3)
	s.leases.margin = leaseMargin // what production uses; the scripted store sets none
	c := limit.Check{Key: "drift", Limit: 1000, WindowUS: 60e6, Hits: 1, Lease: true}
	grantThenSpend(t, s, c, 100)
	lag.Store(1000)             // 1 ms behind by now
	redis.Store(T + 60e6 + 500) // Redis: 0.5 ms into the next window; here 0.5 ms before it ends
	if n := window(t, s, c); n != int(c.Limit) {
		t.Errorf("the next window admitted %d, want its limit of %d", n, c.Limit)
	}
}

// TestLeaseDoubleRefund: a refund returns hits to the grant only as far
// as the grant was used, and lowers that use: a second refund of the same
// hits goes to Redis (with the hits held, as any refund past the use
// does), so the window still admits exactly its limit.
func TestLeaseDoubleRefund(t *testing.T) {
	srv := redistest.Start(t)
	s, _, _ := scriptedLeases(t, srv, time.Now().UnixMicro())
	c := limit.Check{Key: "twice", Limit: 100, WindowUS: 3600e6, Hits: 1, Lease: true}
	admitOne(t, s, c) // 1 in Redis
	s.leases.entries[c.Key].Rate = 5000
	s.leases.pass(false)
	for range 5 {
		admitOne(t, s, c) // 5 from the grant
	}
	back := c
	back.Hits, back.Refund = 5, true
	admitOne(t, s, back) // the 5 back to the grant
	admitOne(t, s, back) // 5 more: past what the grant used
	// Without lease: 6 used, then 5 and 5 back: 0 used, 100 to come.
	if n := window(t, s, c); n != 100 {
		t.Errorf("%d admitted after two refunds of 5 (of 6 used), want 100", n)
	}
}

// TestLeaseRefillInNextWindow: a refill asked in one window whose script
// runs in the next (a round trip across the boundary) brings that
// window's hits, and the old window's hits still held must go: kept,
// they would be spent in the new window on top of its limit.
func TestLeaseRefillInNextWindow(t *testing.T) {
	srv := redistest.Start(t)
	T := time.Now().Truncate(time.Minute).Add(time.Minute).UnixMicro()
	s, redis, lag := driftLeases(t, srv, T+59_800e3)
	c := limit.Check{Key: "refill", Limit: 1000, WindowUS: 60e6, Hits: 1, Lease: true}
	grantThenSpend(t, s, c, 100)
	// The refill leaves 5 ms before the window's end here and runs 5 ms
	// after it on Redis.
	lag.Store(10e3)
	redis.Store(T + 60e6 + 5e3)
	g := s.leases.entries[c.Key]
	g.Rate = 5000
	s.leases.pass(false)
	if g.windowEnd != T+120e6 {
		t.Fatalf("the refill's window ends at %d, want the next window's %d", g.windowEnd, T+120e6)
	}
	if n := window(t, s, c); n != int(c.Limit) {
		t.Errorf("the next window admitted %d, want its limit of %d", n, c.Limit)
	}
}

// TestLeaseIdleForgotten: a counter idle for long enough leaves the lease
// map, whether it holds a grant (given back first), held one and spent
// it, or never earned one, so the map holds only counters in use.
func TestLeaseIdleForgotten(t *testing.T) {
	srv := redistest.Start(t)
	s, _, clock := scriptedLeases(t, srv, time.Now().Truncate(time.Hour).UnixMicro()+1e6)
	granted := limit.Check{Key: "idle:granted", Limit: 1000, WindowUS: 3600e6, Hits: 1, Lease: true}
	cold := limit.Check{Key: "idle:cold", Limit: 1000, WindowUS: 3600e6, Hits: 1, Lease: true}
	spent := limit.Check{Key: "idle:spent", Limit: 1000, WindowUS: 3600e6, Hits: 1, Lease: true}
	admitOne(t, s, granted)
	admitOne(t, s, cold)
	s.leases.entries[granted.Key].Rate = 5000
	s.leases.pass(false)
	admitOne(t, s, granted)
	if !s.leases.entries[granted.Key].granted {
		t.Fatal("no grant taken")
	}
	// Last, so that no pass tops it up again.
	grantThenSpend(t, s, spent, 0) // granted, and nothing left to give back
	clock.Add(2e6)                 // idle past max(1 s, 10 intervals)
	for _, g := range s.leases.entries {
		g.Rate, g.Asked = 0, 0 // as long idle: the smoothed rate has decayed
	}
	s.leases.pass(false) // gives the granted counter's hits back
	s.leases.pass(false)
	if n := len(s.leases.entries); n != 0 {
		t.Errorf("%d counters still in the lease map after they went idle", n)
	}
}

// lostGiveBacks is a Backend whose give-backs run in Redis but answer an
// error, as a call that timed out after it was sent.
type lostGiveBacks struct{ Backend }

func (b lostGiveBacks) GrantWithin(ctx context.Context, ops []limit.GrantOp) ([]limit.GrantResult, error) {
	out, err := b.Backend.GrantWithin(ctx, ops)
	for _, op := range ops {
		if op.GiveBack {
			return nil, errors.New("i/o timeout")
		}
	}
	return out, err
}

// TestLeaseLostGiveBackNotKept: an idle counter's give-back whose answer
// is lost may have run, so its hits are not held again (they would be
// admitted twice: from the grant and from Redis) but counted lost; the
// window admits at most its limit.
func TestLeaseLostGiveBackNotKept(t *testing.T) {
	srv := redistest.Start(t)
	s, m, clock := scriptedLeases(t, srv, time.Now().Truncate(time.Hour).UnixMicro()+1e6)
	s.leases.b = lostGiveBacks{s.leases.b}
	c := limit.Check{Key: "lost", Limit: 100, WindowUS: 3600e6, Hits: 1, Lease: true}
	const keep = 5
	n := 1
	admitOne(t, s, c)
	g := s.leases.entries[c.Key]
	g.Rate = 5000
	s.leases.pass(false)
	for g.avail > keep {
		admitOne(t, s, c)
		n++
	}
	clock.Add(2e6) // idle: the 5 held go back, the answer lost
	s.leases.pass(false)
	n += window(t, s, c)
	if n > int(c.Limit) {
		t.Errorf("%d admitted on a limit of %d: a give-back whose answer was lost was held again", n, c.Limit)
	}
	if lost := hits(m, "lost"); lost != keep {
		t.Errorf("%d hits counted lost, want the %d of the unanswered give-back", lost, keep)
	}
}
