package service_test

import (
	"testing"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/ratelimitd/ratelimitd/config"
	"github.com/ratelimitd/ratelimitd/internal/memstore"
	"github.com/ratelimitd/ratelimitd/internal/metrics"
	"github.com/ratelimitd/ratelimitd/internal/overlimitcache"
	"github.com/ratelimitd/ratelimitd/internal/record"
	"github.com/ratelimitd/ratelimitd/internal/service"
)

// holeRules add to the budgets a limit of one request an hour.
const holeRules = budgetRules + `
  - key: tiny
    rate_limit: {unit: hour, requests_per_unit: 1}
`

// remaining is what a budget check of user=u reports left.
func remaining(t *testing.T, s *service.Service, u string) uint32 {
	t.Helper()
	return call(t, s, aiRequest(tokens(0, "user", u))).GetStatuses()[0].GetLimitRemaining()
}

// TestRequestHitsAddendCharges: a request-level hits_addend states the
// usage of every descriptor without its own, as a descriptor's does: a
// charge, recorded when it crosses the budget and the request is refused.
func TestRequestHitsAddendCharges(t *testing.T) {
	forEachStore(t, func(t *testing.T, st service.Store) {
		m := metrics.New("test")
		s := service.New(parseRules(t, budgetRules), st, nil, service.Options{Recorders: []record.Recorder{metrics.Recorder{M: m}}})
		for _, n := range []uint32{900, 500} {
			req := aiRequest(desc("user", "rq"))
			req.HitsAddend = n
			call(t, s, req)
		}
		if left := remaining(t, s, "rq"); left != 0 {
			t.Fatalf("%d left after request-level charges of 900 and 500 on 1,000, want 0 (the refused charge recorded)", left)
		}
		if got := testutil.ToFloat64(m.Hits.WithLabelValues("ai", "ai.user", service.HitsCharged)); got != 1400 {
			t.Fatalf("charged hits %v, want 1400", got)
		}
	})
}

// TestOverrideRejectedHitsNothing: under --rejected-hits nothing, a limit
// override's refused charge consumes nothing either (an override has no
// rejected_hits of its own).
func TestOverrideRejectedHitsNothing(t *testing.T) {
	forEachStore(t, func(t *testing.T, st service.Store) {
		s := service.New(parseRules(t, budgetRules), st, nil, service.Options{RejectedHits: config.RejectedNothing})
		over := func(n uint64) *rlcommon.RateLimitDescriptor {
			d := tokens(n, "user", "ov")
			d.Limit = &rlcommon.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 1000, Unit: typev3.RateLimitUnit_HOUR}
			return d
		}
		call(t, s, aiRequest(over(900)))
		if r := call(t, s, aiRequest(over(500))); codes(r) != "OVER_LIMIT OVER_LIMIT" {
			t.Fatalf("crossing charge on an override: %v", codes(r))
		}
		if r := call(t, s, aiRequest(over(100))); codes(r) != "OK OK" {
			t.Fatalf("charge of 100 after a refused 500 (nothing consumed): %v, want OK", r)
		}
	})
}

// TestChargeBesideCachedRefusal: a request the local cache refuses for
// one counter still records the usage charge of another: a charge always
// reaches the store.
func TestChargeBesideCachedRefusal(t *testing.T) {
	forEachStore(t, func(t *testing.T, st service.Store) {
		s := service.New(parseRules(t, holeRules), st, overlimitcache.New(1<<20), service.Options{})
		call(t, s, aiRequest(desc("tiny", "x"))) // spends it: the cache holds it exhausted
		if r := call(t, s, aiRequest(desc("tiny", "x"), tokens(300, "user", "cb"))); codes(r) != "OVER_LIMIT OVER_LIMIT OK" {
			t.Fatalf("charge beside an exhausted counter: %v", codes(r))
		}
		if left := remaining(t, s, "cb"); left != 700 {
			t.Fatalf("%d left after a charge of 300 beside a cached refusal, want 700", left)
		}
	})
}

// TestHitsMetricClasses: in a refused request, a counter that was not
// over consumed nothing: its hits are refused, not charged; a charge is.
func TestHitsMetricClasses(t *testing.T) {
	forEachStore(t, func(t *testing.T, st service.Store) {
		m := metrics.New("test")
		s := service.New(parseRules(t, holeRules), st, nil, service.Options{Recorders: []record.Recorder{metrics.Recorder{M: m}}})
		call(t, s, aiRequest(desc("tiny", "y")))
		if r := call(t, s, aiRequest(desc("tiny", "y"), desc("rps", "r"), tokens(40, "user", "mc"))); codes(r) != "OVER_LIMIT OVER_LIMIT OK OK" {
			t.Fatalf("refused request: %v", codes(r))
		}
		for _, c := range []struct {
			label, result string
			want          float64
		}{
			{"ai.rps", service.HitsCharged, 0}, {"ai.rps", service.HitsRefused, 1},
			{"ai.tiny", service.HitsCharged, 1}, {"ai.tiny", service.HitsRefused, 1},
			{"ai.user", service.HitsCharged, 40},
		} {
			if got := testutil.ToFloat64(m.Hits.WithLabelValues("ai", c.label, c.result)); got != c.want {
				t.Errorf("%s %s: %v hits, want %v", c.label, c.result, got, c.want)
			}
		}
		if left := call(t, s, aiRequest(desc("rps", "r"))).GetStatuses()[0].GetLimitRemaining(); left != 99 {
			t.Fatalf("rps after a refused request and one admitted: %d left, want 99", left)
		}
	})
}

// TestResponseMetadataBesideDecisions: --response-dynamic-metadata and
// --decision-metadata share one dynamic_metadata Struct: the incumbent's
// fields and "decisions" side by side, neither lost.
func TestResponseMetadataBesideDecisions(t *testing.T) {
	snap := parseRules(t, `
domain: ai
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 10}
    metadata: {backend: primary}
`)
	for _, both := range []bool{false, true} {
		s := service.New(snap, memstore.New(memstore.Options{}), nil, service.Options{ResponseMetadata: true, DecisionMetadata: both})
		md := call(t, s, aiRequest(desc("user", "u"))).GetDynamicMetadata().GetFields()
		if md["domain"].GetStringValue() != "ai" || md["metadata"].GetStructValue().GetFields()["backend"].GetStringValue() != "primary" ||
			md["descriptors"].GetListValue().GetValues()[0].GetStructValue().GetFields()["entries"].GetListValue().GetValues()[0].GetStringValue() != "user=u" {
			t.Fatalf("decisions %v: the incumbent's fields %v", both, md)
		}
		if _, ok := md["decisions"]; ok != both {
			t.Fatalf("decisions %v: %v", both, md)
		}
	}
}
