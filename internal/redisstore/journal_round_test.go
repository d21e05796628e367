package redisstore

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/ratelimitd/ratelimitd/internal/limit"
	"github.com/ratelimitd/ratelimitd/internal/redisstore/redistest"
)

// TestJournalRoundLeavesNewCharges: the round that sees the master
// change re-applies the charges noted before it began, not one noted
// since, which the new master recorded itself. The round's beginning is
// held fixed (roundUpTo) and the master changed as a promoted replica
// does: its data kept, its replication ID new.
func TestJournalRoundLeavesNewCharges(t *testing.T) {
	srv := redistest.Start(t)
	m := NewMetrics(prometheus.NewRegistry())
	s, err := New(Options{URL: srv.URL(), Timeout: time.Second, Metrics: m})
	if err != nil {
		t.Fatal(err)
	}
	// A journal no goroutine runs: the test runs its round.
	s.journal, s.journalStop = newJournal(s, 0), make(chan struct{})
	defer s.Close()
	ctx := context.Background()
	c := srv.Client()
	info, err := c.Info(ctx, "replication").Result()
	if err != nil {
		t.Fatal(err)
	}
	s.journal.master = infoField(info, "master_replid")
	charge := func(hits uint64) limit.Check {
		return limit.Check{Key: "spend", Limit: 1_000_000, WindowUS: 24 * 3600e6, Hits: hits, Usage: true, FlightS: 300}
	}
	if _, err := s.Evaluate(ctx, []limit.Check{charge(5)}); err != nil {
		t.Fatal(err)
	}
	upTo := s.journal.seq
	for _, args := range [][]any{{"REPLICAOF", "127.0.0.1", "1"}, {"REPLICAOF", "NO", "ONE"}} {
		if err := c.Do(ctx, args...).Err(); err != nil {
			t.Fatal(err)
		}
	}
	if info, _ := c.Info(ctx, "replication").Result(); infoField(info, "master_replid") == s.journal.master {
		t.Fatal("the master's replication ID did not change")
	}
	if _, err := s.Evaluate(ctx, []limit.Check{charge(7)}); err != nil {
		t.Fatal(err)
	}
	s.journal.roundUpTo(ctx, upTo, 1)
	res, err := s.Evaluate(ctx, []limit.Check{charge(0)})
	if err != nil {
		t.Fatal(err)
	}
	if used := res[0].Used(1_000_000); used != 17 {
		t.Errorf("the counter holds %d, want 17: 5 and 7 recorded, the 5 re-applied (24: the new master's 7 too)", used)
	}
	if n := testutil.ToFloat64(m.JournalCharges.WithLabelValues(JournalReapplied)); n != 1 {
		t.Errorf("%v charges re-applied, want 1", n)
	}
}
