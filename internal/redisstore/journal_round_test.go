package redisstore

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/ratelimitd/ratelimitd/internal/limit"
	"github.com/ratelimitd/ratelimitd/internal/redisstore/redistest"
)

// TestJournalRoundCountsEachChargeOnce: the round that sees the master
// change re-applies every charge no replica acknowledged, and each
// counts once: one the new master lacks is recorded, one it has (the
// replica received it before it was promoted, or it was charged there
// since) is skipped by its mark. The round's beginning is held fixed
// (roundUpTo) and the master changed as a promoted replica does: its
// replication ID new, here holding none of the first charge.
func TestJournalRoundCountsEachChargeOnce(t *testing.T) {
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
	for _, args := range [][]any{{"REPLICAOF", "127.0.0.1", "1"}, {"REPLICAOF", "NO", "ONE"}, {"FLUSHALL"}} {
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
	if used := res[0].Used(1_000_000); used != 12 {
		t.Errorf("the counter holds %d, want 12: the 7 the new master has, and the 5 it lost re-applied (19: the 7 twice)", used)
	}
	if n := testutil.ToFloat64(m.JournalCharges.WithLabelValues(JournalReapplied)); n != 2 {
		t.Errorf("%v charges re-applied, want 2 (the 7 skipped by its mark)", n)
	}
	// A second change with nothing lost: every charge re-applied, none
	// counted again.
	s.journal.master = "another"
	s.journal.roundUpTo(ctx, s.journal.seq, 2)
	if res, err := s.Evaluate(ctx, []limit.Check{charge(0)}); err != nil || res[0].Used(1_000_000) != 12 {
		t.Errorf("after re-applying charges the master has: %+v, %v; want 12 used", res, err)
	}
}

// TestReapplyingBusyJournalCountsNothingTwice: charges of many callers
// at once, batched several to a script call, all re-applied when the
// master's identity changes while the data stayed: the count is what
// was charged.
func TestReapplyingBusyJournalCountsNothingTwice(t *testing.T) {
	srv := redistest.Start(t)
	s, err := New(Options{URL: srv.URL(), Timeout: time.Second, Metrics: NewMetrics(prometheus.NewRegistry())})
	if err != nil {
		t.Fatal(err)
	}
	s.journal, s.journalStop = newJournal(s, 0), make(chan struct{})
	defer s.Close()
	ctx := context.Background()
	s.journal.master = "before"
	charge := limit.Check{Key: "busy", Limit: 1 << 40, WindowUS: 24 * 3600e6, Hits: 3, Usage: true, FlightS: 300}
	var wg sync.WaitGroup
	for range 64 {
		wg.Go(func() {
			for range 50 {
				if _, err := s.Evaluate(ctx, []limit.Check{charge}); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	s.journal.roundUpTo(ctx, s.journal.seq, 1)
	peek := charge
	peek.Hits = 0
	res, err := s.Evaluate(ctx, []limit.Check{peek})
	if err != nil {
		t.Fatal(err)
	}
	if used := res[0].Used(charge.Limit); used != 64*50*3 {
		t.Errorf("after re-applying every charge: %d used, want %d", used, 64*50*3)
	}
}

// TestKeptChargesMarked: a charge Redis could not take is kept with a
// mark, as a sent one is: the call that applies it may go unanswered and
// be sent again (a stall's end counted 1.4 % of a budget twice so).
func TestKeptChargesMarked(t *testing.T) {
	srv := redistest.Start(t)
	link := redistest.NewLink(t, srv.Addr())
	s, err := New(Options{URL: fmt.Sprintf("redis://127.0.0.1:%d", link.Port), Timeout: 200 * time.Millisecond,
		Metrics: NewMetrics(prometheus.NewRegistry())})
	if err != nil {
		t.Fatal(err)
	}
	s.journal, s.journalStop = newJournal(s, 0), make(chan struct{})
	defer func() {
		// Back, so that closing applies what is kept at once and no
		// dial outlives the test.
		link.Restore(t)
		s.Close()
	}()
	link.Cut()
	charge := limit.Check{Key: "kept", Limit: 1000, WindowUS: 3600e6, Hits: 3, Usage: true, FlightS: 300}
	if _, err := s.Evaluate(context.Background(), []limit.Check{charge}); err == nil {
		t.Fatal("a charge answered with Redis cut off")
	}
	s.KeepCharges([]limit.Check{charge})
	s.journal.mu.Lock()
	kept := append(append([]journalEntry(nil), s.journal.redo...), s.journal.unsure...)
	s.journal.mu.Unlock()
	if len(kept) != 2 {
		t.Fatalf("%d charges kept, want 2", len(kept))
	}
	for _, e := range kept {
		if e.check.MarkKey == "" {
			t.Errorf("a kept charge without a mark: %+v", e.check)
		}
	}
	if kept[0].check.MarkKey == kept[1].check.MarkKey && kept[0].check.MarkOff == kept[1].check.MarkOff {
		t.Errorf("two charges with one mark: %s bit %d", kept[0].check.MarkKey, kept[0].check.MarkOff)
	}
}

// TestCloseConfirmsRecordedCharges: a store closing with only recorded,
// unconfirmed charges (none left to apply) still runs a last round, so
// the charges its replica already has are confirmed, not reported
// abandoned at every shutdown.
func TestCloseConfirmsRecordedCharges(t *testing.T) {
	st := redistest.StartSentinel(t)
	m := NewMetrics(prometheus.NewRegistry())
	s, err := New(Options{URL: st.Master.URL(), Timeout: time.Second, Metrics: m})
	if err != nil {
		t.Fatal(err)
	}
	// A journal no goroutine runs: only close's rounds confirm.
	s.journal, s.journalStop = newJournal(s, 0), make(chan struct{})
	charge := limit.Check{Key: "spend", Limit: 1_000_000, WindowUS: 24 * 3600e6, Hits: 5, Usage: true, FlightS: 300}
	if _, err := s.Evaluate(context.Background(), []limit.Check{charge}); err != nil {
		t.Fatal(err)
	}
	if n := s.journal.len(); n != 1 {
		t.Fatalf("%d charges in the journal, want the one recorded", n)
	}
	// The replica has it (its offset reaches the master's): the round's
	// WAIT is answered at once, however busy the machine.
	ctx := context.Background()
	deadline := time.Now().Add(20 * time.Second)
	for {
		mi, _ := st.Master.Client().Info(ctx, "replication").Result()
		ri, _ := st.Replica.Client().Info(ctx, "replication").Result()
		if off := infoField(mi, "master_repl_offset"); off != "" && off == infoField(ri, "slave_repl_offset") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the replica not in sync after 20s")
		}
		time.Sleep(20 * time.Millisecond)
	}
	s.Close()
	confirmed := testutil.ToFloat64(m.JournalCharges.WithLabelValues(JournalConfirmed))
	abandoned := testutil.ToFloat64(m.JournalCharges.WithLabelValues(JournalAbandoned))
	if confirmed != 1 || abandoned != 0 {
		t.Errorf("at close: %v confirmed, %v abandoned; want 1 and 0 (the replica has it)", confirmed, abandoned)
	}
}
