package redisstore_test

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/ratelimitd/ratelimitd/internal/limit"
	"github.com/ratelimitd/ratelimitd/internal/redisstore"
	"github.com/ratelimitd/ratelimitd/internal/redisstore/redistest"
)

// failoverStore is a store on a Sentinel's url (or another, as edits
// say) with the charge journal on or off, probing the master every
// 100 ms, and its metrics; the caller closes it.
func failoverStore(tb testing.TB, url string, on bool, edits ...func(*redisstore.Options)) (*redisstore.Store, *redisstore.Metrics) {
	tb.Helper()
	m := redisstore.NewMetrics(prometheus.NewRegistry())
	opts := redisstore.Options{URL: url, Timeout: time.Second, ProbeInterval: 100 * time.Millisecond, ChargeJournal: on, Metrics: m}
	for _, edit := range edits {
		edit(&opts)
	}
	s, err := redisstore.New(opts)
	if err != nil {
		tb.Fatal(err)
	}
	return s, m
}

// journalCharge is a charge of hits on a day's budget of 1,000,000: no
// window ends in a test.
func journalCharge(key string, hits uint64) limit.Check {
	return limit.Check{Key: key, Limit: 1_000_000, WindowUS: 24 * 3600e6, Hits: hits, Usage: true, FlightS: 300}
}

// charged reads the budget's usage: the limit less what a check finds
// left.
func charged(t *testing.T, s *redisstore.Store, key string) (uint64, error) {
	t.Helper()
	c := journalCharge(key, 0)
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	r, err := s.Evaluate(ctx, []limit.Check{c})
	if err != nil {
		return 0, err
	}
	return c.Limit - r[0].Remaining, nil
}

func journalOutcome(m *redisstore.Metrics, outcome string) int {
	return int(testutil.ToFloat64(m.JournalCharges.WithLabelValues(outcome)))
}

// waitFor polls cond until it holds or the deadline passes: generous,
// for a busy machine.
func waitFor(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not within %v: %s", within, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestChargeJournalFailover: a charge the replica had acknowledged is on
// the promoted replica once; a charge it had not (its link to the master
// held, then cut with the master killed) is applied again by the journal
// after Sentinel's failover; without the journal that charge is lost,
// which the test shows too.
func TestChargeJournalFailover(t *testing.T) {
	for _, on := range []bool{true, false} {
		t.Run(fmt.Sprintf("journal=%v", on), func(t *testing.T) {
			st, link := redistest.StartSentinelLinked(t)
			s, m := failoverStore(t, st.URL(), on)
			defer s.Close()
			ctx := context.Background()
			if _, err := s.Evaluate(ctx, []limit.Check{journalCharge("spend", 100)}); err != nil {
				t.Fatal(err)
			}
			if on {
				waitFor(t, 20*time.Second, "the first charge confirmed", func() bool { return journalOutcome(m, redisstore.JournalConfirmed) == 1 })
			} else {
				// The replica has it once its offset reaches the master's.
				waitFor(t, 20*time.Second, "the replica in sync", func() bool {
					mi, _ := st.Master.Client().Info(ctx, "replication").Result()
					ri, _ := st.Replica.Client().Info(ctx, "replication").Result()
					return redisstore.InfoField(mi, "master_repl_offset") != "" && redisstore.InfoField(mi, "master_repl_offset") == redisstore.InfoField(ri, "slave_repl_offset")
				})
			}
			link.Hold()
			if _, err := s.Evaluate(ctx, []limit.Check{journalCharge("spend", 40)}); err != nil {
				t.Fatal(err)
			}
			if got, err := charged(t, s, "spend"); err != nil || got != 140 {
				t.Fatalf("the master counts %d (%v), want 140", got, err)
			}
			// A charge on a second's window, which ends long before the
			// failover: never applied again, into a window that never
			// had it.
			brief := limit.Check{Key: "brief", Limit: 1_000_000, WindowUS: 1e6, Hits: 9, Usage: true, FlightS: 300}
			if _, err := s.Evaluate(ctx, []limit.Check{brief}); err != nil {
				t.Fatal(err)
			}
			if on {
				// Rounds have asked (each waits up to 200 ms for an
				// acknowledgement), and the held replica gave none.
				time.Sleep(time.Second)
				if n := testutil.ToFloat64(m.JournalPending); n != 2 {
					t.Fatalf("%v charges pending with the replica held, want 2", n)
				}
			}
			oldMaster := st.Master.Addr()
			st.Master.Kill()
			link.Cut()
			st.AwaitFailover(t, oldMaster, 20*time.Second, 60*time.Second)
			want := uint64(100)
			if on {
				want = 140
			}
			var got uint64
			var readErr error
			deadline := time.Now().Add(30 * time.Second)
			for got, readErr = charged(t, s, "spend"); readErr != nil || got != want; got, readErr = charged(t, s, "spend") {
				if time.Now().After(deadline) {
					t.Fatalf("the new master counts %d (%v) 30s after the failover, want %d", got, readErr, want)
				}
				time.Sleep(20 * time.Millisecond)
			}
			if on {
				waitFor(t, 10*time.Second, "the re-applied charge confirmed", func() bool {
					return testutil.ToFloat64(m.JournalPending) == 0
				})
				if got, err := charged(t, s, "spend"); err != nil || got != 140 {
					t.Fatalf("the new master counts %d (%v), want 140: the confirmed charge applied twice, or the lost one not", got, err)
				}
				if n := journalOutcome(m, redisstore.JournalReapplied); n != 1 {
					t.Errorf("%d charges re-applied, want 1", n)
				}
				if n := journalOutcome(m, redisstore.JournalExpired); n != 1 {
					t.Errorf("%d charges expired at the failover, want 1 (the second's window had ended)", n)
				}
			}
			t.Logf("journal %v: the new master counts %d of the 140 charged", on, got)
		})
	}
}

// TestChargeJournalBound: charges a held replica never acknowledges stay
// in the journal up to its bound; past it the oldest are dropped,
// counted in the metric and a log line; the store's Close counts what
// is left as abandoned.
func TestChargeJournalBound(t *testing.T) {
	master := redistest.Start(t)
	link := redistest.NewLink(t, master.Addr())
	redistest.Start(t, "--replicaof", "127.0.0.1", fmt.Sprint(link.Port))
	ctx := context.Background()
	waitFor(t, 20*time.Second, "the replica connected", func() bool {
		info, _ := master.Client().Info(ctx, "replication").Result()
		return redisstore.InfoField(info, "connected_slaves") == "1"
	})
	link.Hold()
	m := redisstore.NewMetrics(prometheus.NewRegistry())
	var logs syncBuf
	// Room for about five entries of these keys.
	s, err := redisstore.New(redisstore.Options{URL: master.URL(), Timeout: time.Second, ChargeJournal: true, JournalBytes: 5 * 170,
		Metrics: m, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 12 {
		if _, err := s.Evaluate(ctx, []limit.Check{journalCharge(fmt.Sprintf("b%d", i), 7)}); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(4 * redisstore.JournalEvery)
	pending, dropped := int(testutil.ToFloat64(m.JournalPending)), journalOutcome(m, redisstore.JournalDropped)
	if pending != 5 || dropped != 7 || journalOutcome(m, redisstore.JournalConfirmed) != 0 {
		t.Errorf("pending %d, dropped %d, confirmed %d: want 5, 7, 0", pending, dropped, journalOutcome(m, redisstore.JournalConfirmed))
	}
	if !strings.Contains(logs.String(), "charge journal full") {
		t.Errorf("no log line of the drop:\n%s", logs.String())
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if n := journalOutcome(m, redisstore.JournalAbandoned); n != 5 {
		t.Errorf("%d abandoned at Close, want 5", n)
	}
	if !strings.Contains(logs.String(), "stopping with usage charges no replica acknowledged") {
		t.Errorf("no log line of the abandoned charges:\n%s", logs.String())
	}
}

// TestChargeJournalNoReplica: on a Redis without a replica the journal
// says once what it cannot do there, keeps nothing, and counts the
// charges no_replica, with no error per charge.
func TestChargeJournalNoReplica(t *testing.T) {
	srv := redistest.Start(t)
	m := redisstore.NewMetrics(prometheus.NewRegistry())
	var logs syncBuf
	s, err := redisstore.New(redisstore.Options{URL: srv.URL(), Timeout: time.Second, ChargeJournal: true,
		Metrics: m, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	for i := range 20 {
		if _, err := s.Evaluate(ctx, []limit.Check{journalCharge("alone", uint64(i+2))}); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, 10*time.Second, "the charges counted no_replica", func() bool { return journalOutcome(m, redisstore.JournalNoReplica) == 20 })
	if n := testutil.ToFloat64(m.JournalPending); n != 0 {
		t.Errorf("%v charges kept without a replica", n)
	}
	if c := strings.Count(logs.String(), "has no replica"); c != 1 {
		t.Errorf("%d lines saying there is no replica, want 1:\n%s", c, logs.String())
	}
	if strings.Contains(logs.String(), "level=ERROR") {
		t.Errorf("errors logged:\n%s", logs.String())
	}
}

// TestChargeJournalFreesConfirmed: a confirmed charge gives its room
// back: twenty charges, each confirmed by the replica before the next,
// pass through a journal with room for five, and none is dropped.
func TestChargeJournalFreesConfirmed(t *testing.T) {
	master := redistest.Start(t)
	redistest.Start(t, "--replicaof", "127.0.0.1", fmt.Sprint(master.Port))
	ctx := context.Background()
	waitFor(t, 20*time.Second, "the replica connected", func() bool {
		info, _ := master.Client().Info(ctx, "replication").Result()
		return redisstore.InfoField(info, "connected_slaves") == "1"
	})
	m := redisstore.NewMetrics(prometheus.NewRegistry())
	s, err := redisstore.New(redisstore.Options{URL: master.URL(), Timeout: time.Second, ChargeJournal: true, JournalBytes: 5 * 170, Metrics: m})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for i := range 20 {
		if _, err := s.Evaluate(ctx, []limit.Check{journalCharge(fmt.Sprintf("f%d", i), 7)}); err != nil {
			t.Fatal(err)
		}
		waitFor(t, 20*time.Second, fmt.Sprintf("charge %d confirmed", i+1), func() bool { return journalOutcome(m, redisstore.JournalConfirmed) == i+1 })
	}
	if dropped := journalOutcome(m, redisstore.JournalDropped); dropped != 0 {
		t.Errorf("%d charges dropped from a journal each confirmed charge left", dropped)
	}
}
