package redistest

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// TestWAN: a Redis behind the proxy answers a PING in no less than the
// round trip; replies keep their order whatever the jitter; while
// partitioned nothing answers (the caller's timeout fires, the
// connection stays); once healed, a new call is answered, and what was
// sent during the partition was delivered (the counter it incremented
// counts it once).
func TestWAN(t *testing.T) {
	srv := Start(t)
	const rtt = 100 * time.Millisecond
	w := NewWAN(t, srv.Addr(), rtt, 20*time.Millisecond)
	srv.Client().Set(context.Background(), "k", 0, 0)
	c := redis.NewClient(&redis.Options{Addr: w.Addr(), MaxRetries: -1, ContextTimeoutEnabled: true})
	t.Cleanup(func() { c.Close() })
	ctx := context.Background()
	start := time.Now()
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took < rtt {
		t.Errorf("PING through the proxy took %v, under the round trip %v", took, rtt)
	}
	// Pipelined increments come back in order, each its own count.
	pipe := c.Pipeline()
	cmds := make([]*redis.IntCmd, 50)
	for i := range cmds {
		cmds[i] = pipe.Incr(ctx, "k")
	}
	if _, err := pipe.Exec(ctx); err != nil {
		t.Fatal(err)
	}
	for i, cmd := range cmds {
		if cmd.Val() != int64(i+1) {
			t.Fatalf("reply %d is %d: the proxy reordered", i, cmd.Val())
		}
	}
	w.Partition()
	tctx, cancel := context.WithTimeout(ctx, 3*rtt)
	err := c.Incr(tctx, "k").Err()
	cancel()
	var nerr net.Error
	if err == nil || !errors.Is(err, context.DeadlineExceeded) && !(errors.As(err, &nerr) && nerr.Timeout()) {
		t.Fatalf("a call across the partition: %v, want its timeout", err)
	}
	t.Logf("partition call: %v at %v", err, time.Since(start))
	w.Heal()
	deadline := time.Now().Add(10 * time.Second)
	for {
		n, err := srv.Client().Get(ctx, "k").Int()
		if err == nil && n == 51 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after the heal the counter is %d (%v), want 51: the call sent during the partition delivered once", n, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("counted at %v", time.Since(start))
	if err := c.Ping(ctx).Err(); err != nil {
		t.Errorf("after the heal: %v", err)
	}
}
