package service_test

import (
	"sync/atomic"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/ratelimitd/ratelimitd/internal/memstore"
	"github.com/ratelimitd/ratelimitd/internal/metrics"
	"github.com/ratelimitd/ratelimitd/internal/record"
	"github.com/ratelimitd/ratelimitd/internal/redisstore"
	"github.com/ratelimitd/ratelimitd/internal/redisstore/redistest"
	"github.com/ratelimitd/ratelimitd/internal/service"
)

// clocked runs f on both stores with one scripted clock, which f moves.
func clocked(t *testing.T, f func(t *testing.T, s *service.Service, advance func(time.Duration))) {
	t.Helper()
	clockedWith(t, budgetShapes, service.Options{}, f)
}

// clockedWith is clocked with other rules and options.
func clockedWith(t *testing.T, rules string, opts service.Options, f func(t *testing.T, s *service.Service, advance func(time.Duration))) {
	t.Helper()
	run := func(t *testing.T, st func(now func() time.Time) service.Store) {
		var clock atomic.Int64
		clock.Store(time.Date(2026, 12, 4, 10, 0, 0, 0, time.UTC).UnixMicro())
		now := func() time.Time { return time.UnixMicro(clock.Load()) }
		o := opts
		o.Recorders, o.Now = []record.Recorder{metrics.Recorder{M: metrics.New("test")}}, now
		s := service.New(parseRules(t, rules), st(now), nil, o)
		f(t, s, func(d time.Duration) { clock.Add(d.Microseconds()) })
	}
	t.Run("memstore", func(t *testing.T) {
		run(t, func(now func() time.Time) service.Store { return memstore.New(memstore.Options{Now: now}) })
	})
	t.Run("redis", func(t *testing.T) {
		srv := redistest.Start(t)
		run(t, func(now func() time.Time) service.Store {
			rs, err := redisstore.New(redisstore.Options{URL: srv.URL(), Timeout: time.Second, ScriptTime: now})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { rs.Close() })
			return rs
		})
	})
}

// budgetShapes are the budgets of the traffic AI Gateway sends: per-user
// token kinds charged at stream end, and a QuotaPolicy-style budget whose
// request-phase call states no hits.
const budgetShapes = `
domain: ai
descriptors:
  - key: total
    rate_limit: {unit: hour, requests_per_unit: 10000}
  - key: cached
    rate_limit: {unit: hour, requests_per_unit: 1000}
  - key: big
    rate_limit: {unit: hour, requests_per_unit: 1000000}
  - key: fresh
    rate_limit: {unit: hour, requests_per_unit: 100000}
  - key: quota
    rate_limit: {unit: hour, requests_per_unit: 18000}
`

func okay(t *testing.T, s *service.Service, what string, req *rlsv3.RateLimitRequest, want bool) *rlsv3.RateLimitResponse {
	t.Helper()
	r := call(t, s, req)
	if got := r.GetOverallCode() == rlsv3.RateLimitResponse_OK; got != want {
		t.Fatalf("%s: %v, want OK %v", what, codes(r), want)
	}
	return r
}

// TestUnchargedChecksReleased: a check, a charge of 2,500 of 10,000, then
// checks whose charge never comes (failed or cancelled streams; two fit,
// one charge widened to 5,000 a check).
// They hold the budget only as long as streams last, not for the usage
// timeout; the refusal meanwhile tells the real remainder and a short
// retry.
func TestUnchargedChecksReleased(t *testing.T) {
	clocked(t, func(t *testing.T, s *service.Service, advance func(time.Duration)) {
		okay(t, s, "check", aiRequest(tokens(0, "total", "u")), true)
		advance(200 * time.Millisecond)
		call(t, s, aiRequest(tokens(2500, "total", "u")))
		for range 2 {
			okay(t, s, "uncharged check", aiRequest(tokens(0, "total", "u")), true)
		}
		r := okay(t, s, "third check", aiRequest(tokens(0, "total", "u")), false)
		st := r.GetStatuses()[0]
		if st.GetLimitRemaining() != 7500 || st.GetDurationUntilReset().AsDuration() > time.Second {
			t.Fatalf("refusal for flights: %v, want 7500 left and a retry within a second", st)
		}
		advance(401 * time.Millisecond) // twice the 200 ms the stream lasted
		okay(t, s, "check after the streams' horizon", aiRequest(tokens(0, "total", "u")), true)
	})
}

// TestZeroChargesEndFlights: AI Gateway charges every token kind at
// stream end, the cached kind 0 on most streams; those zero charges end
// flights (and pull the usage toward 0) instead of adding one each.
func TestZeroChargesEndFlights(t *testing.T) {
	clocked(t, func(t *testing.T, s *service.Service, advance func(time.Duration)) {
		for range 20 {
			okay(t, s, "checks of both kinds", aiRequest(tokens(0, "total", "u"), tokens(0, "cached", "u")), true)
			advance(50 * time.Millisecond)
			call(t, s, aiRequest(tokens(300, "total", "u"), tokens(0, "cached", "u")))
		}
		// No flight is left on either budget: four more concurrent checks
		// (the cold quota) are all admitted.
		for range 4 {
			okay(t, s, "concurrent check after zero charges", aiRequest(tokens(0, "cached", "u")), true)
		}
	})
}

// TestLargeChargeNoSelfLock: check, charge 600,000 of 1,000,000, check:
// the rest of the budget stays usable.
func TestLargeChargeNoSelfLock(t *testing.T) {
	clocked(t, func(t *testing.T, s *service.Service, advance func(time.Duration)) {
		okay(t, s, "check", aiRequest(tokens(0, "big", "u")), true)
		advance(time.Second)
		call(t, s, aiRequest(tokens(600_000, "big", "u")))
		okay(t, s, "check with 400,000 left", aiRequest(tokens(0, "big", "u")), true)
	})
}

// TestColdStartBounded: before any charge tells the usage per stream, a
// fresh budget lets at most four checks be in flight.
func TestColdStartBounded(t *testing.T) {
	clocked(t, func(t *testing.T, s *service.Service, advance func(time.Duration)) {
		for range 4 {
			okay(t, s, "cold check", aiRequest(tokens(0, "fresh", "u")), true)
		}
		okay(t, s, "fifth cold check", aiRequest(tokens(0, "fresh", "u")), false)
		advance(100 * time.Millisecond)
		call(t, s, aiRequest(tokens(2000, "fresh", "u")))
		okay(t, s, "check once the usage is known", aiRequest(tokens(0, "fresh", "u")), true)
	})
}

// TestQuotaPolicyShape: AI Gateway's QuotaPolicy checks at request time
// stating no hits (a cost of 1) and charges quota_cost at stream end.
// Once the counter has seen a charge, those requests join the flights,
// so the budget's bound holds for them too; refused, they cost nothing.
func TestQuotaPolicyShape(t *testing.T) {
	clocked(t, func(t *testing.T, s *service.Service, advance func(time.Duration)) {
		okay(t, s, "first request", aiRequest(desc("quota", "u")), true)
		advance(100 * time.Millisecond)
		call(t, s, aiRequest(tokens(2000, "quota", "u")))
		// 2,001 spent; each request in flight counts 4,000 more (one
		// charge of 2,000, widened).
		for i := range 4 {
			if r := okay(t, s, "request", aiRequest(desc("quota", "u")), true); i == 3 && r.GetStatuses()[0].GetLimitRemaining() != 15995 {
				t.Fatalf("after four requests: %v, want 15995 left (each costs 1)", r.GetStatuses()[0])
			}
		}
		r := okay(t, s, "request past the flights", aiRequest(desc("quota", "u")), false)
		if r.GetStatuses()[0].GetLimitRemaining() != 15995 {
			t.Fatalf("refused request: %v, want 15995 left: it cost nothing", r.GetStatuses()[0])
		}
		// A request-phase cost of 1 stated (Envoy Gateway's cost.request)
		// is a check that costs 1 too.
		okay(t, s, "stated cost", aiRequest(tokens(1, "quota", "u")), false)
		advance(50 * time.Millisecond)
		call(t, s, aiRequest(tokens(100, "quota", "u")))
		okay(t, s, "request after a charge ended a flight", aiRequest(desc("quota", "u")), true)
		// A counter is a budget once a charge lands on it, not its rule:
		// another user's first requests are plain requests, however many
		// run at once, each costing 1.
		for i := range 10 {
			r := okay(t, s, "request of another user before any charge", aiRequest(desc("quota", "v")), true)
			if got := r.GetStatuses()[0].GetLimitRemaining(); got != uint32(18000-1-i) {
				t.Fatalf("request %d of another user: %d left, want %d", i+1, got, 18000-1-i)
			}
		}
	})
}

// TestQuotaFlowsEndedBeforeCharged: QuotaPolicy's flows (a request phase
// costing 1, then the stream end stating the tokens) whose upstream
// failed end with a stream end of 0. One read before the counter was
// ever charged ended its request, so the first charge puts in flight only
// the requests still running; on the budget the charge made, a 0 from a
// request phase that costs 1 is its stream's end and ends its flight. So
// costs 0, 4, 0 and 6 on a quota of 10 pass as the incumbent passes them
// (request phases counted 1 each: 14 in all), and the fifth is refused.
func TestQuotaFlowsEndedBeforeCharged(t *testing.T) {
	clockedWith(t, plainShapes, service.Options{}, func(t *testing.T, s *service.Service, advance func(time.Duration)) {
		advance(15 * time.Second)
		for i, cost := range []uint64{0, 4, 0, 6} {
			r := call(t, s, aiRequest(desc("quota", "q")))
			if r.GetOverallCode() != rlsv3.RateLimitResponse_OK {
				t.Fatalf("flow %d (cost %d): the request phase: %v", i+1, cost, r)
			}
			advance(300 * time.Millisecond)
			call(t, s, aiRequest(tokens(cost, "quota", "q")))
			advance(20 * time.Millisecond)
		}
		wantStatus(t, "the fifth request phase", call(t, s, aiRequest(desc("quota", "q"))), rlsv3.RateLimitResponse_OVER_LIMIT, 0, 59*time.Minute+44*time.Second)
	})
}
