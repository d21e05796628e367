package service_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync/atomic"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/ratelimitd/ratelimitd/config"
	"github.com/ratelimitd/ratelimitd/internal/limit"
	"github.com/ratelimitd/ratelimitd/internal/metrics"
	"github.com/ratelimitd/ratelimitd/internal/record"
	"github.com/ratelimitd/ratelimitd/internal/service"
)

// TestHugeHitsStayExact is the bypass once found: an exhausted counter
// named by every descriptor of a request with hits_addend 2^32-1 (request
// level or each descriptor's own) summed past what the script's packed
// argument holds exactly, the script failed, and the failure policy let
// the request through. Every number a valid request can carry must decide
// exactly: over the limit, no store error, no fail-open; and a refund far
// above the count empties it.
func TestHugeHitsStayExact(t *testing.T) {
	forEachStore(t, func(t *testing.T, st service.Store) {
		m := metrics.New("test")
		// All or nothing (--rejected-hits nothing): under usage, huge
		// stated hits are charged, and TestUsageCharges covers that.
		s := service.New(rules(t), st, nil, service.Options{Recorders: []record.Recorder{metrics.Recorder{M: m}}, RejectedHits: config.RejectedNothing})
		for range 3 {
			call(t, s, request(desc("user", "x")))
		}
		many := func() *rlcommon.RateLimitDescriptor { return desc("user", "x") }
		byRequest := request(many(), many(), many(), many(), many(), many(), many(), many(), many())
		byRequest.HitsAddend = math.MaxUint32
		byDescriptor := request(many(), many(), many(), many(), many(), many(), many(), many(), many())
		for _, d := range byDescriptor.Descriptors {
			d.HitsAddend = wrapperspb.UInt64(math.MaxUint32)
		}
		// A fresh counter too: huge hits are over a limit with room left.
		fresh := request(many(), many(), desc("ip", "fresh"))
		fresh.HitsAddend = math.MaxUint32
		for name, req := range map[string]struct {
			give []*rlcommon.RateLimitDescriptor
			hits uint32
		}{
			"request hits_addend":    {byRequest.Descriptors, byRequest.HitsAddend},
			"descriptor hits_addend": {byDescriptor.Descriptors, 0},
			"fresh counter":          {fresh.Descriptors, fresh.HitsAddend},
		} {
			r := request(req.give...)
			r.HitsAddend = req.hits
			resp := call(t, s, r)
			if got := resp.GetOverallCode().String(); got != "OVER_LIMIT" {
				t.Errorf("%s: overall %s, want OVER_LIMIT", name, got)
			}
		}
		if n := outcomes(t, m, service.OutcomeFailOpen) + outcomes(t, m, service.OutcomeFailClosed); n != 0 {
			t.Errorf("answers by failure policy: %v, want 0", n)
		}
		// The fresh ip counter consumed nothing.
		if r := call(t, s, request(desc("ip", "fresh"))); r.GetStatuses()[0].GetLimitRemaining() != 99 {
			t.Errorf("ip after rejected huge request: %v", r)
		}

		// A refund of 4 x 2^31 on one counter (summed by the service past
		// 2^32) empties it rather than being lost.
		ref := request(many(), many(), many(), many())
		for _, d := range ref.Descriptors {
			d.IsNegativeHits = true
			d.HitsAddend = wrapperspb.UInt64(1 << 31)
		}
		call(t, s, ref)
		if r := call(t, s, request(desc("user", "x"))); codes(r) != "OK OK" || r.GetStatuses()[0].GetLimitRemaining() != 2 {
			t.Errorf("after a refund of 2^33: %v, want OK with 2 remaining", r)
		}
		if n := outcomes(t, m, service.OutcomeFailOpen) + outcomes(t, m, service.OutcomeFailClosed); n != 0 {
			t.Errorf("answers by failure policy after the refund: %v, want 0", n)
		}
	})
}

// blockingStore answers only when the call's context ends.
type blockingStore struct{}

func (blockingStore) Evaluate(ctx context.Context, _ []limit.Check) ([]limit.Result, error) {
	<-ctx.Done()
	return nil, ctx.Err()
}

// TestCanceledCallerNotAnswered: a caller that cancels before the store
// decides gets no answer by failure policy, and nothing is counted as
// fail-open (a client resetting every stream would otherwise raise that
// count at will); a call whose time ran out is still answered by policy.
func TestCanceledCallerNotAnswered(t *testing.T) {
	m := metrics.New("test")
	s := service.New(rules(t), blockingStore{}, nil, service.Options{Recorders: []record.Recorder{metrics.Recorder{M: m}}})
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(20*time.Millisecond, cancel)
	if _, err := s.ShouldRateLimit(ctx, request(desc("user", "c"))); !errors.Is(err, service.ErrCanceled) || !errors.Is(err, context.Canceled) {
		t.Fatalf("canceled call: err = %v, want ErrCanceled", err)
	}
	if fo, c := outcomes(t, m, service.OutcomeFailOpen), testutil.ToFloat64(m.CanceledRequests); fo != 0 || c != 1 {
		t.Errorf("fail-open %v, canceled %v; want 0, 1", fo, c)
	}
	tctx, tcancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer tcancel()
	resp, err := s.ShouldRateLimit(tctx, request(desc("user", "c")))
	if fo := outcomes(t, m, service.OutcomeFailOpen); err != nil || resp.GetOverallCode().String() != "OK" || fo != 1 {
		t.Errorf("timed-out call: %v, %v, fail-open %v; want OK by policy", resp, err, fo)
	}
}

// canceledErrStore fails every call with an error that wraps
// context.Canceled, as a store's own cancellation would (a round trip it
// gave up, a breaker answer), while the caller is still waiting.
type canceledErrStore struct{}

func (canceledErrStore) Evaluate(context.Context, []limit.Check) ([]limit.Result, error) {
	return nil, fmt.Errorf("store: gave up: %w", context.Canceled)
}

// TestCancellationIsTheCallers: whether a caller canceled is read from the
// caller's context, never from the store's error: a store error that
// wraps context.Canceled, with the caller still there, is a store failure
// answered by policy (and counted fail-open), not a silent cancellation.
func TestCancellationIsTheCallers(t *testing.T) {
	m := metrics.New("test")
	s := service.New(rules(t), canceledErrStore{}, nil, service.Options{Recorders: []record.Recorder{metrics.Recorder{M: m}}})
	resp, err := s.ShouldRateLimit(context.Background(), request(desc("user", "c")))
	if err != nil || resp.GetOverallCode().String() != "OK" {
		t.Fatalf("store error wrapping Canceled, caller waiting: %v, %v; want OK by failure policy", resp, err)
	}
	if fo, c := outcomes(t, m, service.OutcomeFailOpen), testutil.ToFloat64(m.CanceledRequests); fo != 1 || c != 0 {
		t.Errorf("fail-open %v, canceled %v; want 1, 0", fo, c)
	}
}

// TestHitsOfUnknownOutcome: a charge whose store call timed out, or whose
// caller went away, may have been recorded: it is counted unknown, never
// lost and never nowhere; one the store refused outright is lost.
func TestHitsOfUnknownOutcome(t *testing.T) {
	count := func(m *metrics.Metrics, result string) float64 {
		return testutil.ToFloat64(m.Hits.WithLabelValues("ai", "ai.user", result))
	}
	m := metrics.New("test")
	s := service.New(parseRules(t, budgetRules), blockingStore{}, nil, service.Options{Recorders: []record.Recorder{metrics.Recorder{M: m}}})
	tctx, tcancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
	defer tcancel()
	if _, err := s.ShouldRateLimit(tctx, aiRequest(tokens(300, "user", "u"))); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(20*time.Millisecond, cancel)
	if _, err := s.ShouldRateLimit(ctx, aiRequest(tokens(40, "user", "u"))); !errors.Is(err, service.ErrCanceled) {
		t.Fatalf("canceled: %v", err)
	}
	if u, l := count(m, service.HitsUnknown), count(m, service.HitsLost); u != 340 || l != 0 {
		t.Fatalf("timed out and canceled charges: unknown %v, lost %v; want 340, 0", u, l)
	}
	m = metrics.New("test")
	s = service.New(parseRules(t, budgetRules), failingStore{}, nil, service.Options{Recorders: []record.Recorder{metrics.Recorder{M: m}}})
	call(t, s, aiRequest(tokens(700, "user", "u")))
	if u, l := count(m, service.HitsUnknown), count(m, service.HitsLost); u != 0 || l != 700 {
		t.Fatalf("refused by the store: unknown %v, lost %v; want 0, 700", u, l)
	}
}

// keepingStore fails every call as a store with a charge journal does:
// its charges kept (the error says so); KeepCharges keeps those of a
// call it was never asked to decide.
type keepingStore struct{ kept *atomic.Int64 }

func (keepingStore) Evaluate(context.Context, []limit.Check) ([]limit.Result, error) {
	return nil, fmt.Errorf("store down (%w)", limit.ErrChargesKept)
}

func (k keepingStore) KeepCharges(checks []limit.Check) bool {
	k.kept.Add(int64(len(checks)))
	return true
}

// TestHitsKeptByTheJournal: a charge the store's journal keeps is
// counted kept, not lost, whether the store failed the call or the
// caller's deadline left no time to send it (the store is handed it to
// apply later).
func TestHitsKeptByTheJournal(t *testing.T) {
	m := metrics.New("test")
	var kept atomic.Int64
	s := service.New(parseRules(t, budgetRules), keepingStore{&kept}, nil, service.Options{Recorders: []record.Recorder{metrics.Recorder{M: m}}})
	call(t, s, aiRequest(tokens(700, "user", "u")))
	ctx, cancel := context.WithTimeout(context.Background(), time.Millisecond)
	defer cancel()
	if _, err := s.ShouldRateLimit(ctx, aiRequest(tokens(40, "user", "u"))); err != nil {
		t.Fatal(err)
	}
	count := func(result string) float64 {
		return testutil.ToFloat64(m.Hits.WithLabelValues("ai", "ai.user", result))
	}
	if k, l := count(service.HitsKept), count(service.HitsLost); k != 740 || l != 0 {
		t.Errorf("charges kept by the journal: kept %v, lost %v; want 740, 0", k, l)
	}
	if kept.Load() != 1 {
		t.Errorf("%d charges handed to the store with no time to send them, want 1", kept.Load())
	}
}
