package redisstore_test

import (
	"context"
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/ratelimitd/ratelimitd/internal/limit"
	"github.com/ratelimitd/ratelimitd/internal/redisstore"
	"github.com/ratelimitd/ratelimitd/internal/redisstore/redistest"
)

// TestChargeJournalClusterFailover: on a Redis Cluster of three masters
// with a replica each, a charge the budget slot's replica had
// acknowledged is on the promoted replica once; a charge sent to it
// while it was paused is not confirmed, and one it never received (its
// link cut by the master, then the master killed) neither: both are
// re-applied by the journal once the Cluster has promoted the replica,
// and count once; without the journal the last is lost, which the test
// shows too. The other master's charges are confirmed by its own
// replica meanwhile.
func TestChargeJournalClusterFailover(t *testing.T) {
	for _, on := range []bool{true, false} {
		t.Run(fmt.Sprintf("journal=%v", on), func(t *testing.T) {
			c := redistest.StartReplicatedCluster(t, 3)
			s, m := failoverStore(t, c.URL(), on, func(o *redisstore.Options) { o.Mode = redisstore.ModeCluster })
			t.Cleanup(func() {
				s.Close()
				awaitDialersGone(t)
			})
			ctx := context.Background()
			const key, other = "spend", "other-spend"
			sl, err := c.Masters[0].Client().ClusterKeySlot(ctx, key).Result()
			if err != nil {
				t.Fatal(err)
			}
			i := c.MasterOf(int(sl))
			osl, _ := c.Masters[0].Client().ClusterKeySlot(ctx, other).Result()
			if c.MasterOf(int(osl)) == i {
				t.Fatalf("%q and %q share a master", key, other)
			}
			if _, err := s.Evaluate(ctx, []limit.Check{journalCharge(key, 100), journalCharge(other, 7)}); err != nil {
				t.Fatal(err)
			}
			if on {
				waitFor(t, 20*time.Second, "the first charges confirmed", func() bool { return journalOutcome(m, redisstore.JournalConfirmed) == 2 })
			} else {
				awaitInSync(t, c.Masters[i], c.Replicas[i])
			}
			// The replica stops, its link alive: the master sends it a
			// charge it does not acknowledge.
			c.Replicas[i].Pause()
			if _, err := s.Evaluate(ctx, []limit.Check{journalCharge(key, 40), journalCharge(other, 3)}); err != nil {
				t.Fatal(err)
			}
			if on {
				// The other master's replica confirms its charge; this
				// one's cannot, however many rounds ask (each waits up to
				// 200 ms).
				waitFor(t, 20*time.Second, "the other master's charge confirmed", func() bool { return journalOutcome(m, redisstore.JournalConfirmed) == 3 })
				time.Sleep(time.Second)
				if n := testutil.ToFloat64(m.JournalPending); n != 1 {
					t.Fatalf("%v charges pending with the replica paused, want 1", n)
				}
			}
			// Then the master drops the link: what it records from now
			// on, the replica never gets.
			if err := c.Masters[i].Client().Do(ctx, "CLIENT", "KILL", "TYPE", "replica").Err(); err != nil {
				t.Fatal(err)
			}
			if _, err := s.Evaluate(ctx, []limit.Check{journalCharge(key, 20)}); err != nil {
				t.Fatal(err)
			}
			if got, err := charged(t, s, key); err != nil || got != 160 {
				t.Fatalf("the master counts %d (%v), want 160", got, err)
			}
			if on {
				time.Sleep(time.Second)
				if n := testutil.ToFloat64(m.JournalPending); n != 2 {
					t.Fatalf("%v charges pending with the master's replica gone a second, want 2", n)
				}
			}
			c.Masters[i].Kill()
			c.Replicas[i].Resume()
			c.AwaitPromotion(t, i, 15*time.Second, 60*time.Second)
			var got uint64
			var readErr error
			deadline := time.Now().Add(30 * time.Second)
			// The journal's charges counted once each, or without it the
			// last lost (the one before may have reached the replica).
			done := func(got uint64) bool { return on && got == 160 || !on && got <= 140 }
			for got, readErr = charged(t, s, key); readErr != nil || !done(got); got, readErr = charged(t, s, key) {
				if time.Now().After(deadline) {
					t.Fatalf("the promoted replica counts %d (%v) 30s after the failover, want %s", got, readErr, map[bool]string{true: "160", false: "at most 140"}[on])
				}
				time.Sleep(20 * time.Millisecond)
			}
			if on {
				waitFor(t, 20*time.Second, "the re-applied charges confirmed", func() bool { return testutil.ToFloat64(m.JournalPending) == 0 })
				if got, err := charged(t, s, key); err != nil || got != 160 {
					t.Fatalf("the promoted replica counts %d (%v), want 160: a charge applied twice, or a lost one not", got, err)
				}
				if n := journalOutcome(m, redisstore.JournalReapplied); n != 2 {
					t.Errorf("%d charges re-applied, want 2 (only the failed master's slot)", n)
				}
			}
			if got, err := charged(t, s, other); err != nil || got != 10 {
				t.Errorf("the other master counts %d (%v), want 10", got, err)
			}
			t.Logf("journal %v: the promoted replica counts %d of the 160 charged", on, got)
		})
	}
}

// awaitInSync waits until replica's offset reaches master's.
func awaitInSync(t *testing.T, master, replica *redistest.Server) {
	t.Helper()
	ctx := context.Background()
	waitFor(t, 20*time.Second, "the replica in sync", func() bool {
		mi, _ := master.Client().Info(ctx, "replication").Result()
		ri, _ := replica.Client().Info(ctx, "replication").Result()
		off := redisstore.InfoField(mi, "master_repl_offset")
		return off != "" && off == redisstore.InfoField(ri, "slave_repl_offset")
	})
}

// awaitDialersGone waits for go-redis's background dialers of a dead
// node to see their client closed: each wakes once a second.
func awaitDialersGone(tb testing.TB) {
	tb.Helper()
	buf := make([]byte, 1<<20)
	deadline := time.Now().Add(20 * time.Second)
	for strings.Contains(string(buf[:runtime.Stack(buf, true)]), "pool.(*ConnPool).tryDial") {
		if time.Now().After(deadline) {
			tb.Fatalf("go-redis's dialers of the dead master still run 20s after the store closed")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestClusterBarrierWaitsForReplica: a Cluster master's barrier is
// acknowledged only by a replica that has it: with the replica paused
// (its link alive), none is, on a connection that wrote nothing before.
// (A PUBLISH, which Cluster does not replicate, is "acknowledged" at
// once there: WAIT has no write of the connection's to wait for.)
func TestClusterBarrierWaitsForReplica(t *testing.T) {
	c := redistest.StartReplicatedCluster(t, 3)
	ctx := context.Background()
	// A replica in sync acknowledges a barrier: within a round's WAIT
	// (200 ms) on a quiet machine, within a few rounds on a busy one.
	deadline := time.Now().Add(20 * time.Second)
	for {
		ok, err := redisstore.BarrierAcked(ctx, c.Masters[0].Client())
		if err == nil && ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("a barrier with the replica in sync: never acknowledged in 20s (%v)", err)
		}
	}
	c.Replicas[0].Pause()
	defer c.Replicas[0].Resume()
	for range 3 {
		if ok, err := redisstore.BarrierAcked(ctx, c.Masters[0].Client()); err != nil || ok {
			t.Fatalf("a barrier with the replica paused: acknowledged %v (%v), want false", ok, err)
		}
	}
}
