package service_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/ratelimitd/ratelimitd/internal/limit"
	"github.com/ratelimitd/ratelimitd/internal/memstore"
	"github.com/ratelimitd/ratelimitd/internal/service"
)

// plainShapes are the rules of the call-shape tests: a request limit of
// 20 a minute (envoyproxy/ratelimit's integration suite's shape) and a
// QuotaPolicy-style quota of 10 an hour.
const plainShapes = `
domain: ai
descriptors:
  - key: minute
    rate_limit: {unit: minute, requests_per_unit: 20}
  - key: quota
    rate_limit: {unit: hour, requests_per_unit: 10}
  - key: quota_s
    rate_limit: {unit: second, requests_per_unit: 10}
  - key: quota_d
    rate_limit: {unit: day, requests_per_unit: 10}
  - key: wave
    rate_limit: {unit: hour, requests_per_unit: 10000}
`

// shapes are the ways a client says "one request" (docs/token-budgets.md,
// "What each call does"): they must be one call.
var shapes = map[string]func(d *rlcommon.RateLimitDescriptor) *rlsv3.RateLimitRequest{
	"hits unset": func(d *rlcommon.RateLimitDescriptor) *rlsv3.RateLimitRequest { return aiRequest(d) },
	"request-level 0": func(d *rlcommon.RateLimitDescriptor) *rlsv3.RateLimitRequest {
		r := aiRequest(d)
		r.HitsAddend = 0
		return r
	},
	"request-level 1": func(d *rlcommon.RateLimitDescriptor) *rlsv3.RateLimitRequest {
		r := aiRequest(d)
		r.HitsAddend = 1
		return r
	},
	"descriptor-level 1": func(d *rlcommon.RateLimitDescriptor) *rlsv3.RateLimitRequest {
		d.HitsAddend = wrapperspb.UInt64(1)
		return aiRequest(d)
	},
}

// wantStatus fails unless r's first status is code with remaining left
// and the window's reset (whole seconds to the window's end).
func wantStatus(t *testing.T, what string, r *rlsv3.RateLimitResponse, code rlsv3.RateLimitResponse_Code, remaining uint32, reset time.Duration) {
	t.Helper()
	st := r.GetStatuses()[0]
	if r.GetOverallCode() != code || st.GetCode() != code || st.GetLimitRemaining() != remaining ||
		st.GetDurationUntilReset().AsDuration().Round(time.Second) != reset {
		t.Fatalf("%s: %v %v, remaining %d, reset %v; want %v, %d left, reset %v", what, r.GetOverallCode(), st.GetCode(),
			st.GetLimitRemaining(), st.GetDurationUntilReset().AsDuration(), code, remaining, reset)
	}
}

// TestStatedOneIsARequest: a client stating hits_addend 1 (request- or
// descriptor-level, as envoyproxy/ratelimit's integration suite and many
// gRPC clients do), 0 at request level, or nothing, on a fresh counter
// of 20 a minute gets exactly 20 OK, each with the window's remaining
// count and reset, then OVER_LIMIT, also after a peek left the cold
// start's check on the counter; a burst of them at one instant is no
// different (nothing is held in flight for them).
func TestStatedOneIsARequest(t *testing.T) {
	for name, shape := range shapes {
		t.Run(name, func(t *testing.T) {
			clockedWith(t, plainShapes, service.Options{}, func(t *testing.T, s *service.Service, advance func(time.Duration)) {
				advance(15 * time.Second)
				// A peek first leaves the key a cold check's state: the
				// requests after it are no different.
				wantStatus(t, "a peek", call(t, s, aiRequest(tokens(0, "minute", "u"))), rlsv3.RateLimitResponse_OK, 20, 45*time.Second)
				for i := range 20 {
					wantStatus(t, fmt.Sprintf("request %d", i+1), call(t, s, shape(desc("minute", "u"))), rlsv3.RateLimitResponse_OK, uint32(19-i), 45*time.Second)
				}
				wantStatus(t, "request 21", call(t, s, shape(desc("minute", "u"))), rlsv3.RateLimitResponse_OVER_LIMIT, 0, 45*time.Second)
				advance(45 * time.Second)
				wantStatus(t, "the next window's first", call(t, s, shape(desc("minute", "u"))), rlsv3.RateLimitResponse_OK, 19, 60*time.Second)
			})
		})
	}
}

// TestPeeks: a descriptor stating 0 on a counter no charge has been
// recorded on reads it. On a counter holding a count it is never refused
// while the count is within the limit; on an empty counter it may be
// held as a budget's first check only for the cold start's first
// horizon (a second), never after.
func TestPeeks(t *testing.T) {
	clockedWith(t, plainShapes, service.Options{}, func(t *testing.T, s *service.Service, advance func(time.Duration)) {
		for i := range 20 {
			call(t, s, aiRequest(desc("minute", "counted")))
			for range 3 {
				wantStatus(t, "a peek", call(t, s, aiRequest(tokens(0, "minute", "counted"))), rlsv3.RateLimitResponse_OK, uint32(19-i), 60*time.Second)
			}
		}
		wantStatus(t, "a peek at the limit", call(t, s, aiRequest(tokens(0, "minute", "counted"))), rlsv3.RateLimitResponse_OK, 0, 60*time.Second)

		refused := 0
		for range 10 {
			if call(t, s, aiRequest(tokens(0, "minute", "peeked"))).GetOverallCode() != rlsv3.RateLimitResponse_OK {
				refused++
			}
		}
		if refused == 0 || refused > 10-4 {
			t.Fatalf("peeks on an empty counter within the first horizon: %d of 10 refused, want the cold start's (4 admitted)", refused)
		}
		advance(1100 * time.Millisecond)
		for i := range 200 {
			wantStatus(t, fmt.Sprintf("peek %d past the first horizon", i+1), call(t, s, aiRequest(tokens(0, "minute", "peeked"))), rlsv3.RateLimitResponse_OK, 20, 59*time.Second)
		}
	})
}

// TestQuotaFlowsOfCostZero is Envoy AI Gateway's QuotaPolicy with flows
// that cost 0: the request phase states no hits (a cost of 1), the
// stream end states 0. Every Envoy-visible answer is the incumbent's:
// ten flows of a quota of 10 go, the eleventh is refused, with the
// window's remaining count and reset, in 1 s, 1 h and 1 d windows.
func TestQuotaFlowsOfCostZero(t *testing.T) {
	// The clock starts at 10:00 UTC: the day window resets in 14 h.
	for key, window := range map[string]time.Duration{"quota_s": time.Second, "quota": time.Hour, "quota_d": 14 * time.Hour} {
		t.Run(key, func(t *testing.T) {
			clockedWith(t, plainShapes, service.Options{}, func(t *testing.T, s *service.Service, advance func(time.Duration)) {
				for i := range 10 {
					wantStatus(t, fmt.Sprintf("flow %d", i+1), call(t, s, aiRequest(desc(key, "m"))), rlsv3.RateLimitResponse_OK, uint32(9-i), window)
					call(t, s, aiRequest(tokens(0, key, "m")))
				}
				wantStatus(t, "flow 11", call(t, s, aiRequest(desc(key, "m"))), rlsv3.RateLimitResponse_OVER_LIMIT, 0, window)
			})
		})
	}
}

// TestQuotaFlowsOfCost: AI Gateway's QuotaPolicy e2e (a quota of 10, a
// flow charging 20 tokens, then one more flow): the first flow goes, and
// is charged 1 + 20; the next is refused at its request phase and, all
// or nothing, costs nothing (the incumbent counts its 1: 22). And flows of
// cost 5 one after another: the incumbent's answers (the request phase
// refused once the quota is spent).
func TestQuotaFlowsOfCost(t *testing.T) {
	clockedWith(t, plainShapes, service.Options{}, func(t *testing.T, s *service.Service, advance func(time.Duration)) {
		wantStatus(t, "the first flow", call(t, s, aiRequest(desc("quota", "a"))), rlsv3.RateLimitResponse_OK, 9, time.Hour)
		advance(100 * time.Millisecond)
		call(t, s, aiRequest(tokens(20, "quota", "a")))
		wantStatus(t, "the next flow", call(t, s, aiRequest(desc("quota", "a"))), rlsv3.RateLimitResponse_OVER_LIMIT, 0, time.Hour)
		if r := call(t, s, aiRequest(tokens(0, "quota", "a"))); r.GetStatuses()[0].GetLimitRemaining() != 0 {
			t.Fatalf("a peek on the spent quota: %v", r.GetStatuses()[0])
		}

		// Cost 5: 1 + 5, then 7 + 5 = 12, then refused.
		for i, want := range []rlsv3.RateLimitResponse_Code{rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT} {
			r := call(t, s, aiRequest(desc("quota", "b")))
			if r.GetOverallCode() != want {
				t.Fatalf("cost-5 flow %d: %v, want %v", i+1, r.GetOverallCode(), want)
			}
			advance(100 * time.Millisecond)
			if want == rlsv3.RateLimitResponse_OK {
				call(t, s, aiRequest(tokens(5, "quota", "b")))
			}
		}
	})
}

// TestWeightedClient: a client stating hits 5 on a request limit of 20:
// three go, and a call of 10 that crosses the limit is refused and, as a
// call stating its hits under rejected_hits usage, recorded (as the
// incumbent counts it): a request after it finds nothing left.
func TestWeightedClient(t *testing.T) {
	clockedWith(t, plainShapes, service.Options{}, func(t *testing.T, s *service.Service, advance func(time.Duration)) {
		for i := range 3 {
			wantStatus(t, fmt.Sprintf("weighted %d", i+1), call(t, s, aiRequest(tokens(5, "minute", "w"))), rlsv3.RateLimitResponse_OK, uint32(15-5*i), time.Minute)
		}
		wantStatus(t, "a weight of 10 crossing the limit", call(t, s, aiRequest(tokens(10, "minute", "w"))), rlsv3.RateLimitResponse_OVER_LIMIT, 0, time.Minute)
		wantStatus(t, "a request after it", call(t, s, aiRequest(desc("minute", "w"))), rlsv3.RateLimitResponse_OVER_LIMIT, 0, time.Minute)
	})
}

// TestBudgetsOff: with NoBudgets (--budgets off) no call is a budget
// check: peeks on an empty counter are never held, a stated 1 is a
// request, and a stream end's charge is still recorded when it crosses
// the limit, teaching nothing: the next checks on that counter are
// reads, admitted while the count is within the limit.
func TestBudgetsOff(t *testing.T) {
	clockedWith(t, plainShapes, service.Options{NoBudgets: true}, func(t *testing.T, s *service.Service, advance func(time.Duration)) {
		for range 50 {
			wantStatus(t, "a peek on an empty counter", call(t, s, aiRequest(tokens(0, "minute", "p"))), rlsv3.RateLimitResponse_OK, 20, time.Minute)
		}
		for i := range 20 {
			wantStatus(t, "a stated 1", call(t, s, aiRequest(tokens(1, "minute", "p"))), rlsv3.RateLimitResponse_OK, uint32(19-i), time.Minute)
		}
		wantStatus(t, "a stated 1 past the limit", call(t, s, aiRequest(tokens(1, "minute", "p"))), rlsv3.RateLimitResponse_OVER_LIMIT, 0, time.Minute)

		call(t, s, aiRequest(tokens(0, "quota", "c")))
		call(t, s, aiRequest(tokens(6, "quota", "c")))
		for range 10 {
			wantStatus(t, "a check after a charge", call(t, s, aiRequest(tokens(0, "quota", "c"))), rlsv3.RateLimitResponse_OK, 4, time.Hour)
		}
		wantStatus(t, "a charge crossing the quota", call(t, s, aiRequest(tokens(6, "quota", "c"))), rlsv3.RateLimitResponse_OVER_LIMIT, 0, time.Hour)
		wantStatus(t, "a request on the crossed quota", call(t, s, aiRequest(desc("quota", "c"))), rlsv3.RateLimitResponse_OVER_LIMIT, 0, time.Hour)
	})
}

// TestMixedShapes: one request stating 1 on one counter and 0 on
// another, neither charged: a request and a read (or cold check); a
// request-level 1 beside a descriptor stating 0 the same; and a stated 1
// is all or nothing, as a request stating none.
func TestMixedShapes(t *testing.T) {
	clockedWith(t, plainShapes, service.Options{}, func(t *testing.T, s *service.Service, advance func(time.Duration)) {
		call(t, s, aiRequest(desc("quota", "x")))
		for i := range 19 {
			r := call(t, s, aiRequest(tokens(1, "minute", "x"), tokens(0, "quota", "x")))
			wantStatus(t, fmt.Sprintf("mixed %d", i+1), r, rlsv3.RateLimitResponse_OK, uint32(19-i), time.Minute)
			if got := r.GetStatuses()[1].GetLimitRemaining(); got != 9 {
				t.Fatalf("mixed %d: the peeked quota says %d left, want 9", i+1, got)
			}
		}
		r := aiRequest(desc("minute", "x"), tokens(0, "quota", "x"))
		r.HitsAddend = 1
		wantStatus(t, "request-level 1 beside a 0", call(t, s, r), rlsv3.RateLimitResponse_OK, 0, time.Minute)

		// All or nothing: a stated 1 beside a spent quota consumes nothing.
		for range 10 {
			call(t, s, aiRequest(desc("quota", "y")))
		}
		for range 3 {
			r := call(t, s, aiRequest(tokens(1, "minute", "y"), tokens(1, "quota", "y")))
			if r.GetOverallCode() != rlsv3.RateLimitResponse_OVER_LIMIT || r.GetStatuses()[0].GetLimitRemaining() != 20 {
				t.Fatalf("a stated 1 beside a spent quota: %v, want OVER_LIMIT with the minute's 20 untouched", r)
			}
		}
	})
}

// pairedShapes is a budget per user whose descriptor ends with the
// request's id (Envoy's request_headers action on x-request-id).
const pairedShapes = `
domain: ai
descriptors:
  - key: user
    descriptors:
      - key: x-request-id
        request_id: true
        rate_limit: {unit: hour, requests_per_unit: 10000}
`

// TestPairedStreamEnds: with the request's id in its descriptors, every
// request shares the user's counter, and a request's second call is its
// stream end whatever its hits: a stream end of 0 (a failed or empty
// stream) or of 1 ends its own check's flight at once instead of holding
// the budget as another check would, and counts as a charge.
func TestPairedStreamEnds(t *testing.T) {
	clockedWith(t, pairedShapes, service.Options{}, func(t *testing.T, s *service.Service, advance func(time.Duration)) {
		req := func(id string, hits uint64) *rlsv3.RateLimitRequest {
			return aiRequest(tokens(hits, "user", "u", "x-request-id", id))
		}
		okay(t, s, "r1's check", req("r1", 0), true)
		advance(100 * time.Millisecond)
		call(t, s, req("r1", 2500))
		okay(t, s, "r2's check", req("r2", 0), true)
		advance(50 * time.Millisecond)
		call(t, s, req("r2", 0)) // r2's stream end: it spent nothing
		// 2,500 charged, a usage per check of 1,250 widened to 2,083: with
		// r2's flight ended, four checks fit (2,500 + 3 x 2,083 < 10,000).
		for i := range 4 {
			r := okay(t, s, fmt.Sprintf("check %d after r2's end", i+1), req(fmt.Sprintf("c%d", i), 0), true)
			if got := r.GetStatuses()[0].GetLimitRemaining(); got != 7500 {
				t.Fatalf("check %d: %d left on the user's counter, want 7500", i+1, got)
			}
		}
		okay(t, s, "a fifth check", req("c4", 0), false)
		// c0's stream end stating 1: a charge of 1, ending c0's flight.
		advance(50 * time.Millisecond)
		if r := call(t, s, req("c0", 1)); r.GetStatuses()[0].GetLimitRemaining() != 7499 {
			t.Fatalf("c0's stream end of 1: %v, want it charged (7,499 left)", r.GetStatuses()[0])
		}
		okay(t, s, "a check after c0's end", req("c5", 0), true)
	})
}

// TestQuotaFirstWave: QuotaPolicy's first wave on a fresh counter is
// plain requests (nothing says it is a budget yet), but once the first
// stream charges, the other requests it admitted are streams still
// running: they go in flight, so the budget checks that follow are held
// by them (16 requests, a charge of 150: 15 in flight at 300 each, the
// one charge widened; 18 more checks fit in 10,000), and the first
// wave's charges end them rather than the later checks.
func TestQuotaFirstWave(t *testing.T) {
	clockedWith(t, plainShapes, service.Options{}, func(t *testing.T, s *service.Service, advance func(time.Duration)) {
		for i := range 16 {
			okay(t, s, fmt.Sprintf("first-wave request %d", i+1), aiRequest(desc("wave", "q")), true)
		}
		advance(100 * time.Millisecond)
		call(t, s, aiRequest(tokens(150, "wave", "q")))
		admitted := 0
		for call(t, s, aiRequest(desc("wave", "q"))).GetOverallCode() == rlsv3.RateLimitResponse_OK {
			admitted++
			if admitted > 100 {
				break
			}
		}
		if admitted != 18 {
			t.Fatalf("%d budget checks admitted after the first charge, want 18 (the first wave's 15 streams in flight)", admitted)
		}
	})
}

// kindsStore records the checks each Evaluate is given.
type kindsStore struct {
	service.Store
	mu     sync.Mutex
	checks [][]limit.Check
}

func (k *kindsStore) Evaluate(ctx context.Context, checks []limit.Check) ([]limit.Result, error) {
	k.mu.Lock()
	k.checks = append(k.checks, slices.Clone(checks))
	k.mu.Unlock()
	return k.Store.Evaluate(ctx, checks)
}

// TestBudgetsOffMergesToPlainCharge: under --budgets off, a stream end
// stating hits on a counter beside another call on the same counter is
// one plain charge (it teaches nothing and ends no flight), never a
// budget's charge: the two kinds merge into limit.PlainCharge.
func TestBudgetsOffMergesToPlainCharge(t *testing.T) {
	st := &kindsStore{Store: memstore.New(memstore.Options{})}
	s := service.New(parseRules(t, plainShapes), st, nil, service.Options{NoBudgets: true})
	call(t, s, aiRequest(tokens(6, "quota", "m"), tokens(0, "quota", "m")))
	st.mu.Lock()
	defer st.mu.Unlock()
	if len(st.checks) != 1 || len(st.checks[0]) != 1 {
		t.Fatalf("checks sent: %+v, want one call of one check (the counter's)", st.checks)
	}
	if c := st.checks[0][0]; !c.Usage || c.Kind != limit.PlainCharge || c.Hits != 6 {
		t.Errorf("merged check %+v, want a usage charge of 6 of kind PlainCharge (%d)", c, limit.PlainCharge)
	}
}
