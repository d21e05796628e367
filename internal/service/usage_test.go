package service_test

import (
	"context"
	"errors"
	"math"
	"sync/atomic"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/ratelimitd/ratelimitd/config"
	"github.com/ratelimitd/ratelimitd/internal/limit"
	"github.com/ratelimitd/ratelimitd/internal/memstore"
	"github.com/ratelimitd/ratelimitd/internal/metrics"
	"github.com/ratelimitd/ratelimitd/internal/overlimitcache"
	"github.com/ratelimitd/ratelimitd/internal/record"
	"github.com/ratelimitd/ratelimitd/internal/service"
)

// budgetRules are Envoy AI Gateway's shape: per-user and per-tenant token
// budgets (checked with hits 0, charged at stream end), a request limit,
// and one budget that opts out.
const budgetRules = `
domain: ai
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 1000}
  - key: tenant
    rate_limit: {unit: hour, requests_per_unit: 1000000}
  - key: rps
    rate_limit: {unit: hour, requests_per_unit: 100}
  - key: strict
    rate_limit: {unit: hour, requests_per_unit: 1000, rejected_hits: nothing}
`

// tokens is a descriptor stating its hits, as Envoy sends a route's
// hits_addend.
func tokens(n uint64, kv ...string) *rlcommon.RateLimitDescriptor {
	d := desc(kv...)
	d.HitsAddend = wrapperspb.UInt64(n)
	return d
}

func aiRequest(ds ...*rlcommon.RateLimitDescriptor) *rlsv3.RateLimitRequest {
	return &rlsv3.RateLimitRequest{Domain: "ai", Descriptors: ds}
}

// TestUsageCharges is the token budget's sequence (issue: a charge that
// crosses the budget is recorded, and every later check is OVER_LIMIT),
// with the local over-limit cache off and on, on both stores.
func TestUsageCharges(t *testing.T) {
	for _, cached := range []bool{false, true} {
		name := "cache off"
		if cached {
			name = "cache on"
		}
		t.Run(name, func(t *testing.T) {
			forEachStore(t, func(t *testing.T, st service.Store) {
				var cache service.Cache
				if cached {
					cache = overlimitcache.New(1 << 20)
				}
				m := metrics.New("test")
				s := service.New(parseRules(t, budgetRules), st, cache, service.Options{Recorders: []record.Recorder{metrics.Recorder{M: m}}})
				step := func(what string, n uint64, want string, remaining uint32) {
					t.Helper()
					r := call(t, s, aiRequest(tokens(n, "user", "u1")))
					if codes(r) != want || (want == "OK OK" && r.GetStatuses()[0].GetLimitRemaining() != remaining) {
						t.Fatalf("%s: %v, want %s with %d left", what, r, want, remaining)
					}
				}
				step("check", 0, "OK OK", 1000)
				step("charge 900", 900, "OK OK", 100)
				step("charge 500", 500, "OVER_LIMIT OVER_LIMIT", 0)
				for i := range 3 {
					step("check after the crossing charge", 0, "OVER_LIMIT OVER_LIMIT", 0)
					step("charge", uint64(100+i), "OVER_LIMIT OVER_LIMIT", 0)
				}
				if got := testutil.ToFloat64(m.Hits.WithLabelValues("ai", "ai.user", service.HitsCharged)); got != 900+500+100+101+102 {
					t.Errorf("charged hits %v, want every charge (1703)", got)
				}

				// Five budgets in one stream-end call: one spent budget
				// does not void the other charges.
				call(t, s, aiRequest(tokens(0, "tenant", "t1")))
				r := call(t, s, aiRequest(tokens(500, "user", "u1"), tokens(500, "tenant", "t1")))
				if codes(r) != "OVER_LIMIT OVER_LIMIT OK" {
					t.Fatalf("charge on a spent and a fresh budget: %v", codes(r))
				}
				if r := call(t, s, aiRequest(tokens(0, "tenant", "t1"))); r.GetStatuses()[0].GetLimitRemaining() != 999_500 {
					t.Fatalf("tenant after the charge: %v, want 999500 left", r)
				}

				// A request stating no hits, refused, consumes nothing;
				// nor does a stated charge under rejected_hits: nothing.
				r = call(t, s, aiRequest(desc("rps", "r1"), tokens(0, "user", "u1")))
				if codes(r) != "OVER_LIMIT OK OVER_LIMIT" {
					t.Fatalf("request beside a spent budget: %v", codes(r))
				}
				if r := call(t, s, aiRequest(desc("rps", "r1"))); r.GetStatuses()[0].GetLimitRemaining() != 99 {
					t.Fatalf("rps after a refused request: %v, want 99 left", r)
				}
				call(t, s, aiRequest(tokens(900, "strict", "s1")))
				if r := call(t, s, aiRequest(tokens(500, "strict", "s1"))); codes(r) != "OVER_LIMIT OVER_LIMIT" {
					t.Fatalf("strict crossing: %v", codes(r))
				}
				if r := call(t, s, aiRequest(tokens(0, "strict", "s1"))); codes(r) != "OK OK" || r.GetStatuses()[0].GetLimitRemaining() != 100 {
					t.Fatalf("strict after a refused charge: %v, want OK with 100 left (all or nothing)", r)
				}
				if got := testutil.ToFloat64(m.Hits.WithLabelValues("ai", "ai.strict", service.HitsRefused)); got != 500 {
					t.Errorf("refused hits of strict: %v, want 500", got)
				}
			})
		})
	}
}

// TestRejectedHitsNothing: --rejected-hits nothing (the service's
// default for rules that set none, as over xDS) keeps every refused call
// from consuming.
func TestRejectedHitsNothing(t *testing.T) {
	forEachStore(t, func(t *testing.T, st service.Store) {
		s := service.New(parseRules(t, budgetRules), st, nil, service.Options{RejectedHits: config.RejectedNothing})
		call(t, s, aiRequest(tokens(900, "user", "u2")))
		call(t, s, aiRequest(tokens(500, "user", "u2")))
		if r := call(t, s, aiRequest(tokens(0, "user", "u2"))); codes(r) != "OK OK" || r.GetStatuses()[0].GetLimitRemaining() != 100 {
			t.Fatalf("after a refused charge: %v, want OK with 100 left", r)
		}
	})
}

// failingStore cannot decide anything.
type failingStore struct{}

func (failingStore) Evaluate(context.Context, []limit.Check) ([]limit.Result, error) {
	return nil, errors.New("store down")
}

// TestUsageLostCounted: a charge the store cannot record follows the
// failure policy and is counted as lost, never silently dropped.
func TestUsageLostCounted(t *testing.T) {
	m := metrics.New("test")
	s := service.New(parseRules(t, budgetRules), failingStore{}, nil, service.Options{Recorders: []record.Recorder{metrics.Recorder{M: m}}})
	if r := call(t, s, aiRequest(tokens(700, "user", "u3"))); codes(r) != "OK OK" {
		t.Fatalf("fail open by default: %v", codes(r))
	}
	if got := testutil.ToFloat64(m.Hits.WithLabelValues("ai", "ai.user", service.HitsLost)); got != 700 {
		t.Fatalf("lost hits %v, want 700", got)
	}
}

// TestCalendarPeriods: a calendar month resets at the start of the UTC
// month, a plain month 30 days from the epoch does not; --calendar-periods
// makes a rule without the field (as over xDS) a calendar month.
func TestCalendarPeriods(t *testing.T) {
	snap := parseRules(t, `
domain: ai
descriptors:
  - key: billed
    rate_limit: {unit: month, requests_per_unit: 2, calendar: true}
  - key: epoch
    rate_limit: {unit: month, requests_per_unit: 2}
`)
	end, _ := time.Parse(time.RFC3339, "2027-03-31T23:59:59Z")
	for _, periods := range []bool{false, true} {
		var clock atomic.Int64
		clock.Store(end.UnixMicro())
		st := memstore.New(memstore.Options{Now: func() time.Time { return time.UnixMicro(clock.Load()) }})
		s := service.New(snap, st, nil, service.Options{CalendarPeriods: periods})
		for range 2 {
			call(t, s, aiRequest(desc("billed", "b"), desc("epoch", "e")))
		}
		r := call(t, s, aiRequest(desc("billed", "b")))
		if codes(r) != "OVER_LIMIT OVER_LIMIT" || r.GetStatuses()[0].GetDurationUntilReset().GetSeconds() != 1 {
			t.Fatalf("calendar month spent a second before its end: %v", r)
		}
		clock.Add(2e6) // 2027-04-01T00:00:01Z, mid-way through a 30-day window
		if r := call(t, s, aiRequest(desc("billed", "b"))); codes(r) != "OK OK" {
			t.Fatalf("calendar month after the UTC month began: %v", codes(r))
		}
		r = call(t, s, aiRequest(desc("epoch", "e")))
		if want := map[bool]string{false: "OVER_LIMIT OVER_LIMIT", true: "OK OK"}[periods]; codes(r) != want {
			t.Fatalf("a month without calendar, --calendar-periods %v: %v, want %s", periods, codes(r), want)
		}
	}
}

// TestBigBudget: a budget past 2^32 counts exactly; the response's
// uint32 fields show their most, the headers the whole count.
func TestBigBudget(t *testing.T) {
	snap := parseRules(t, "domain: ai\ndescriptors:\n  - key: org\n    rate_limit: {unit: hour, requests_per_unit: 5000000000000}\n")
	forEachStore(t, func(t *testing.T, st service.Store) {
		s := service.New(snap, st, nil, service.Options{ResponseHeaders: service.HeadersLegacy})
		header := func(r *rlsv3.RateLimitResponse, name string) string {
			for _, h := range r.GetResponseHeadersToAdd() {
				if h.GetKey() == name {
					return h.GetValue()
				}
			}
			return ""
		}
		r := call(t, s, aiRequest(tokens(0, "org", "o")))
		if codes(r) != "OK OK" || r.GetStatuses()[0].GetLimitRemaining() != math.MaxUint32 ||
			header(r, service.HeaderLimit) != "5000000000000" || header(r, service.HeaderRemaining) != "5000000000000" {
			t.Fatalf("fresh: %v", r)
		}
		r = call(t, s, aiRequest(tokens(4_999_999_999_999, "org", "o")))
		if codes(r) != "OK OK" || r.GetStatuses()[0].GetLimitRemaining() != 1 || header(r, service.HeaderRemaining) != "1" {
			t.Fatalf("after charging all but one: %v", r)
		}
		if r := call(t, s, aiRequest(tokens(1<<40, "org", "o"))); codes(r) != "OVER_LIMIT OVER_LIMIT" {
			t.Fatalf("charge past the budget: %v", codes(r))
		}
		if r := call(t, s, aiRequest(tokens(0, "org", "o"))); codes(r) != "OVER_LIMIT OVER_LIMIT" {
			t.Fatalf("check after the budget: %v", codes(r))
		}
	})
}
