package redisstore_test

import (
	"context"
	"errors"
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

// keepStore is a store with the charge journal on url (by default: auto), quick to give up
// on Redis (a call's timeout 300 ms, the breaker's probe every 100 ms),
// and its metrics and log.
func keepStore(t *testing.T, url string, journalBytes int) (*redisstore.Store, *redisstore.Metrics, *syncBuf) {
	t.Helper()
	m := redisstore.NewMetrics(prometheus.NewRegistry())
	var logs syncBuf
	s, err := redisstore.New(redisstore.Options{URL: url, Timeout: 300 * time.Millisecond, ProbeInterval: 100 * time.Millisecond,
		ChargeJournalAuto: true, JournalBytes: journalBytes, Metrics: m, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s, m, &logs
}

// chargeKept charges hits on key while the store cannot take them: the
// call fails, saying the charge is kept.
func chargeKept(t *testing.T, s *redisstore.Store, c limit.Check) {
	t.Helper()
	_, err := s.Evaluate(context.Background(), []limit.Check{c})
	if err == nil {
		t.Fatalf("a charge of %d on %s answered with Redis out of reach", c.Hits, c.Key)
	}
	if !errors.Is(err, limit.ErrChargesKept) {
		t.Fatalf("a charge of %d on %s failed without being kept: %v", c.Hits, c.Key, err)
	}
}

// waitCharged waits until the budget key counts want.
func waitCharged(t *testing.T, s *redisstore.Store, key string, want uint64) {
	t.Helper()
	var got uint64
	var err error
	waitFor(t, 30*time.Second, "the kept charges applied", func() bool {
		got, err = charged(t, s, key)
		return err == nil && got == want
	})
}

// TestChargesKeptThroughOutage: charges that come while Redis cannot be
// reached are kept and applied once it can, each once; one whose window
// ended meanwhile is not applied into a window that never had it.
func TestChargesKeptThroughOutage(t *testing.T) {
	srv := redistest.Start(t)
	link := redistest.NewLink(t, srv.Addr())
	s, m, _ := keepStore(t, fmt.Sprintf("redis://127.0.0.1:%d", link.Port), 0)
	ctx := context.Background()
	if _, err := s.Evaluate(ctx, []limit.Check{journalCharge("spend", 10)}); err != nil {
		t.Fatal(err)
	}
	link.Cut()
	chargeKept(t, s, journalCharge("spend", 20))
	chargeKept(t, s, journalCharge("spend", 30))
	// A plain charge (--budgets off: a stream end's stated hits that
	// teach nothing) is usage too: kept the same.
	plain := journalCharge("plain-spend", 15)
	plain.Kind = limit.PlainCharge
	chargeKept(t, s, plain)
	// A second's window, ended before Redis is back.
	brief := limit.Check{Key: "brief", Limit: 1_000_000, WindowUS: 1e6, Hits: 9, Usage: true, FlightS: 300}
	chargeKept(t, s, brief)
	_, end := brief.Window(time.Now().UnixMicro())
	time.Sleep(time.Until(time.UnixMicro(end)) + 100*time.Millisecond)
	if n := journalOutcome(m, redisstore.JournalKept); n != 4 {
		t.Fatalf("%d charges kept, want 4", n)
	}
	link.Restore(t)
	waitCharged(t, s, "spend", 60)
	waitCharged(t, s, "plain-spend", 15)
	waitFor(t, 10*time.Second, "the journal settled", func() bool { return testutil.ToFloat64(m.JournalPending) == 0 })
	if got, err := charged(t, s, "spend"); err != nil || got != 60 {
		t.Fatalf("the budget counts %d (%v) once settled, want 60: a kept charge applied twice", got, err)
	}
	// Applied, or (an apply whose answer came late on a busy machine)
	// taken as recorded: counted once either way, as the budget shows.
	t.Logf("kept charges applied %d, sent again %d", journalOutcome(m, redisstore.JournalApplied), journalOutcome(m, redisstore.JournalResent))
	if n := journalOutcome(m, redisstore.JournalExpired); n != 1 {
		t.Errorf("%d kept charges expired, want 1 (the second's window)", n)
	}
	r, err := s.Evaluate(ctx, []limit.Check{{Key: "brief", Limit: 1_000_000, WindowUS: 1e6, Usage: true, FlightS: 300}})
	if err != nil || r[0].Remaining != 1_000_000 {
		t.Errorf("the second's counter after the outage: %+v (%v), want untouched", r, err)
	}
}

// spentStore is a keepStore on a Redis of its own, its budget "spend"
// charged 5, once a round of the journal has learned the master (with
// no replica to confirm, it keeps nothing it recorded).
func spentStore(t *testing.T) (*redistest.Server, *redisstore.Store, *redisstore.Metrics) {
	t.Helper()
	srv := redistest.Start(t)
	s, m, _ := keepStore(t, srv.URL(), 0)
	if _, err := s.Evaluate(context.Background(), []limit.Check{journalCharge("spend", 5)}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 20*time.Second, "a round", func() bool { return journalOutcome(m, redisstore.JournalNoReplica) == 1 })
	return srv, s, m
}

// TestUnansweredChargeNotLost: a charge sent to a master that never
// answered (hung, then gone: restarted empty, a new replication ID) is
// applied to the master there is afterwards.
func TestUnansweredChargeNotLost(t *testing.T) {
	srv, s, m := spentStore(t)
	srv.Pause()
	chargeKept(t, s, journalCharge("spend", 7))
	srv.Restart()
	waitCharged(t, s, "spend", 7)
	waitFor(t, 30*time.Second, "the journal settled", func() bool { return testutil.ToFloat64(m.JournalPending) == 0 })
	if got, err := charged(t, s, "spend"); err != nil || got != 7 {
		t.Fatalf("the budget counts %d (%v) once settled, want 7: the charge applied twice", got, err)
	}
}

// TestStalledChargesCountedOnce: through a stall of Redis (hung 1.5 s,
// then resumed), charges sent and unanswered are run by Redis when it
// resumes and those the store never sent are applied by the journal:
// every charge counted, none twice.
func TestStalledChargesCountedOnce(t *testing.T) {
	srv, s, m := spentStore(t)
	srv.Pause()
	stalled := time.Now()
	n := 0
	for time.Since(stalled) < 1500*time.Millisecond {
		chargeKept(t, s, journalCharge("spend", 7))
		n++
		time.Sleep(2 * time.Millisecond)
	}
	srv.Resume()
	want := uint64(5 + 7*n)
	waitFor(t, 30*time.Second, "the journal settled", func() bool { return testutil.ToFloat64(m.JournalPending) == 0 })
	if got, err := charged(t, s, "spend"); err != nil || got != want {
		t.Fatalf("the budget counts %d (%v) after the stall, want %d: 5 and %d charges of 7", got, err, want, n)
	}
	t.Logf("%d charges in the stall: %d sent again, %d applied", n, journalOutcome(m, redisstore.JournalResent), journalOutcome(m, redisstore.JournalApplied))
}

// TestDroppedChargeSentAgain: a charge whose request the network lost
// (the connection open, no error, no answer) is not taken as recorded:
// it is sent again, with its mark, once Redis answers, and counted once.
func TestDroppedChargeSentAgain(t *testing.T) {
	srv := redistest.Start(t)
	link := redistest.NewLink(t, srv.Addr())
	s, m, _ := keepStore(t, fmt.Sprintf("redis://127.0.0.1:%d", link.Port), 0)
	if _, err := s.Evaluate(context.Background(), []limit.Check{journalCharge("spend", 5)}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 20*time.Second, "a round", func() bool { return journalOutcome(m, redisstore.JournalNoReplica) >= 1 })
	link.DropRequests()
	chargeKept(t, s, journalCharge("spend", 7))
	link.PassRequests()
	waitCharged(t, s, "spend", 12)
	waitFor(t, 30*time.Second, "the journal settled", func() bool { return testutil.ToFloat64(m.JournalPending) == 0 })
	if got, err := charged(t, s, "spend"); err != nil || got != 12 {
		t.Fatalf("the budget counts %d (%v) once settled, want 12: 5, and the 7 dropped once", got, err)
	}
	if n := journalOutcome(m, redisstore.JournalResent); n < 1 {
		t.Errorf("%d charges sent again, want the one dropped", n)
	}
}

// TestKeptChargesBounded: kept charges count in the journal's bound: past
// it the oldest are dropped, counted and logged.
func TestKeptChargesBounded(t *testing.T) {
	srv := redistest.Start(t)
	link := redistest.NewLink(t, srv.Addr())
	s, m, logs := keepStore(t, fmt.Sprintf("redis://127.0.0.1:%d", link.Port), 5*170)
	link.Cut()
	for range 12 {
		chargeKept(t, s, journalCharge("b0", 7))
	}
	if p, d := int(testutil.ToFloat64(m.JournalPending)), journalOutcome(m, redisstore.JournalDropped); p != 5 || d != 7 {
		t.Errorf("pending %d, dropped %d: want 5, 7", p, d)
	}
	if !strings.Contains(logs.String(), "charge journal full") {
		t.Errorf("no log line of the drop:\n%s", logs.String())
	}
}

// TestCloseHandsKeptChargesOver: a store closing with charges kept (Redis
// was out of reach) applies them once Redis answers, within
// JournalHandoff; what it cannot apply by then is counted abandoned.
func TestCloseHandsKeptChargesOver(t *testing.T) {
	srv := redistest.Start(t)
	link := redistest.NewLink(t, srv.Addr())
	s, m, _ := keepStore(t, fmt.Sprintf("redis://127.0.0.1:%d", link.Port), 0)
	link.Cut()
	chargeKept(t, s, journalCharge("spend", 11))
	closed := make(chan struct{})
	go func() {
		s.Close()
		close(closed)
	}()
	time.Sleep(300 * time.Millisecond)
	link.Restore(t)
	select {
	case <-closed:
	case <-time.After(redisstore.JournalHandoff + 20*time.Second):
		t.Fatal("Close did not return")
	}
	r, err := srv.Client().Keys(context.Background(), "*spend").Result()
	if err != nil || len(r) != 1 {
		t.Fatalf("keys after the hand-off: %v (%v), want the budget's (abandoned %d)", r, err, journalOutcome(m, redisstore.JournalAbandoned))
	}
}
