package service_test

// Answers under failure, deadlines, metrics, headers and bad requests.

import (
	"context"
	"errors"
	"strconv"
	"strings"
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

func TestFailurePolicy(t *testing.T) {
	cs := &countingStore{Store: memstore.New(memstore.Options{})}
	cs.fail.Store(true)
	m := metrics.New("test")
	s := service.New(rules(t), cs, nil, service.Options{ResponseHeaders: service.HeadersLegacy, Recorders: []record.Recorder{metrics.Recorder{M: m}}})
	r := call(t, s, request(desc("zero", "x"), desc("nope", "y"), desc("login", "u")))
	if codes(r) != "OVER_LIMIT OK OK OVER_LIMIT" {
		t.Fatalf("store down = %v, want the default rule open, login (deny) closed", codes(r))
	}
	if fo, fc := outcomes(t, m, service.OutcomeFailOpen), outcomes(t, m, service.OutcomeFailClosed); fo != 1 || fc != 1 || cs.calls.Load() != 1 {
		t.Errorf("fail_open = %v, fail_closed = %v, store calls = %d; want 1, 1, 1", fo, fc, cs.calls.Load())
	}
	if got := testutil.ToFloat64(m.Decisions.WithLabelValues("web", "login", service.OutcomeFailClosed)); got != 1 {
		t.Errorf("fail_closed metric for login = %v", got)
	}
	if got := testutil.ToFloat64(m.Decisions.WithLabelValues("web", "web.zero", service.OutcomeFailOpen)); got != 1 {
		t.Errorf("fail_open metric for web.zero = %v", got)
	}
	if len(r.GetResponseHeadersToAdd()) != 0 {
		t.Errorf("headers from undecided descriptors: %v", r.GetResponseHeadersToAdd())
	}
	// The global mode decides rules that set none; a rule's own wins.
	deny := service.New(rules(t), cs, nil, service.Options{FailureMode: config.FailureDeny})
	if r := call(t, deny, request(desc("zero", "x"), desc("browse", "y"))); codes(r) != "OVER_LIMIT OVER_LIMIT OK" {
		t.Errorf("global deny = %v", codes(r))
	}
	// A refund is never denied.
	ref := request(desc("login", "u"))
	ref.Descriptors[0].IsNegativeHits = true
	if r := call(t, deny, ref); codes(r) != "OK OK" {
		t.Errorf("refund while down = %v", codes(r))
	}
}

// slowStore answers after its delay, or when the context ends, and
// records the deadline it was given.
type slowStore struct {
	delay    time.Duration
	deadline *atomic.Int64 // unix ns
}

func (s slowStore) Evaluate(ctx context.Context, checks []limit.Check) ([]limit.Result, error) {
	if dl, ok := ctx.Deadline(); ok && s.deadline != nil {
		s.deadline.Store(dl.UnixNano())
	}
	select {
	case <-time.After(s.delay):
		return make([]limit.Result, len(checks)), nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

func TestCallerDeadline(t *testing.T) {
	var got atomic.Int64
	s := service.New(rules(t), slowStore{delay: time.Hour, deadline: &got}, nil, service.Options{DeadlineMargin: 5 * time.Millisecond})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	callerDL, _ := ctx.Deadline()
	start := time.Now()
	resp, err := s.ShouldRateLimit(ctx, request(desc("user", "slow")))
	if err != nil || codes(resp) != "OK OK" {
		t.Fatalf("resp = %v, %v; want fail open", resp, err)
	}
	// The store was bounded by the caller's deadline less the margin.
	if storeDL := time.Unix(0, got.Load()); storeDL.After(callerDL.Add(-5 * time.Millisecond)) {
		t.Errorf("store deadline %v, want ≤ the caller's %v less 5ms", storeDL, callerDL)
	}
	if el := time.Since(start); el > 100*time.Millisecond {
		t.Errorf("answered after %v with a 20ms caller deadline", el)
	}
	// A deadline inside the margin: no store call at all.
	ctx2, cancel2 := context.WithTimeout(context.Background(), 2*time.Millisecond)
	defer cancel2()
	start = time.Now()
	if _, err := s.ShouldRateLimit(ctx2, request(desc("user", "slow"))); err != nil {
		t.Fatal(err)
	}
	if el := time.Since(start); el > 10*time.Millisecond {
		t.Errorf("deadline inside the margin answered after %v, want at once (no store call)", el)
	}
}

func TestMetrics(t *testing.T) {
	m := metrics.New("test")
	s := service.New(rules(t), memstore.New(memstore.Options{}), overlimitcache.New(1<<20), service.Options{Recorders: []record.Recorder{metrics.Recorder{M: m}}})
	for range 5 {
		call(t, s, request(desc("user", "m"), desc("unl", "x"), desc("shadow", "s")))
	}
	call(t, s, &rlsv3.RateLimitRequest{Domain: "nowhere", Descriptors: []*rlcommon.RateLimitDescriptor{desc("user", "m")}})
	s.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "web"})
	tests := []struct {
		rule, outcome string
		want          float64
	}{
		{"web.user", service.OutcomeOK, 2},
		{"web.user", service.OutcomeNearLimit, 1}, // 3 of 3 reaches 0.8
		{"web.user", service.OutcomeOverLimit, 0}, // the third OK exhausted it: the cache answers after
		{"web.user", service.OutcomeLocalCache, 2},
		{"web.unl", service.OutcomeUnlimited, 5},
		{"web.shadow", service.OutcomeNearLimit, 1},
		{"web.shadow", service.OutcomeShadow, 4},
	}
	for _, tt := range tests {
		if got := testutil.ToFloat64(m.Decisions.WithLabelValues("web", tt.rule, tt.outcome)); got != tt.want {
			t.Errorf("decisions{rule=%s,outcome=%s} = %v, want %v", tt.rule, tt.outcome, got, tt.want)
		}
	}
	if got := testutil.ToFloat64(m.UnknownDomain); got != 1 {
		t.Errorf("unknown domain = %v", got)
	}
	if got := testutil.ToFloat64(m.InvalidRequests); got != 1 {
		t.Errorf("invalid = %v", got)
	}
	if got := testutil.ToFloat64(m.Requests.WithLabelValues("OVER_LIMIT")); got != 2 {
		t.Errorf("requests over limit = %v", got)
	}
}

func TestHeaders(t *testing.T) {
	s := service.New(rules(t), memstore.New(memstore.Options{}), nil, service.Options{ResponseHeaders: service.HeadersLegacy})
	hdrs := func(r *rlsv3.RateLimitResponse) string {
		var parts []string
		for _, h := range r.GetResponseHeadersToAdd() {
			parts = append(parts, h.GetKey()+"="+h.GetValue())
		}
		return strings.Join(parts, " ")
	}
	r := call(t, s, request(desc("ip", "h"), desc("user", "h")))
	reset := r.GetStatuses()[1].GetDurationUntilReset().GetSeconds()
	want := "RateLimit-Limit=3 RateLimit-Remaining=2 RateLimit-Reset=" + strconv.FormatInt(reset, 10)
	if got := hdrs(r); got != want {
		t.Errorf("headers = %q, want %q", got, want)
	}
	r = call(t, s, request(desc("ip", "h"), desc("zero", "h")))
	reset = r.GetStatuses()[1].GetDurationUntilReset().GetSeconds()
	want = "RateLimit-Limit=0 RateLimit-Remaining=0 RateLimit-Reset=" + strconv.FormatInt(reset, 10) + " Retry-After=" + strconv.FormatInt(reset, 10)
	if got := hdrs(r); got != want {
		t.Errorf("over-limit headers = %q, want %q", got, want)
	}
	d11 := service.New(rules(t), memstore.New(memstore.Options{}), nil, service.Options{ResponseHeaders: service.HeadersDraft11})
	r = call(t, d11, request(desc("ip", "h"), desc("parent", "p", "child", "c")))
	want = `RateLimit-Policy="web.ip";q=100;w=3600, "child-limit";q=2;w=1 RateLimit="child-limit";r=1;t=1`
	if got := hdrs(r); got != want {
		t.Errorf("draft11 headers = %q, want %q", got, want)
	}
	if r := call(t, s, request(desc("nope", "h"))); len(r.GetResponseHeadersToAdd()) != 0 {
		t.Errorf("headers without a limit: %v", hdrs(r))
	}
	// Renamed, as LIMIT_*_HEADER do; a name left empty keeps its default.
	renamed := service.New(rules(t), memstore.New(memstore.Options{}), nil, service.Options{ResponseHeaders: service.HeadersLegacy,
		HeaderNames: service.HeaderNames{Limit: "X-RateLimit-Limit", Reset: "X-RateLimit-Reset"}})
	r = call(t, renamed, request(desc("user", "h")))
	reset = r.GetStatuses()[0].GetDurationUntilReset().GetSeconds()
	want = "X-RateLimit-Limit=3 RateLimit-Remaining=2 X-RateLimit-Reset=" + strconv.FormatInt(reset, 10)
	if got := hdrs(r); got != want {
		t.Errorf("renamed headers = %q, want %q", got, want)
	}
	for name, ok := range map[string]bool{"X-RateLimit-Limit": true, "x_rl~1": true, "": false, "Bad Name": false, "a:b": false, "é": false} {
		if service.ValidHeaderName(name) != ok {
			t.Errorf("ValidHeaderName(%q) = %v", name, !ok)
		}
	}
}

func TestInvalidRequests(t *testing.T) {
	s := service.New(rules(t), memstore.New(memstore.Options{}), nil, service.Options{MaxDescriptors: 2, MaxEntries: 2, MaxEntryBytes: 8})
	big := request(desc("user", "x"))
	big.Descriptors[0].HitsAddend = wrapperspb.UInt64(limit.MaxLimit + 1)
	badUnit := request(desc("user", "x"))
	badUnit.Descriptors[0].Limit = &rlcommon.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 1}
	tests := []struct {
		name    string
		give    *rlsv3.RateLimitRequest
		wantErr string
	}{
		{"empty domain", &rlsv3.RateLimitRequest{Descriptors: []*rlcommon.RateLimitDescriptor{desc("a", "b")}}, "domain must not be empty"},
		{"no descriptors", &rlsv3.RateLimitRequest{Domain: "web"}, "descriptors must not be empty"},
		{"too many descriptors", request(desc("a", "b"), desc("a", "b"), desc("a", "b")), "3 descriptors, more than the 2 allowed"},
		{"too many entries", request(desc("a", "b", "c", "d", "e", "f")), "descriptors[0]: 3 entries, more than the 2 allowed"},
		{"no entries", request(desc()), "descriptors[0] has no entries"},
		{"long value", request(desc("a", "123456789")), "descriptors[0].entries[0].value is 9 bytes, more than the 8 allowed"},
		{"long key", request(desc("a", "b"), desc("123456789", "b")), "descriptors[1].entries[0].key is 9 bytes"},
		{"huge hits", big, "descriptors[0].hits_addend 2251799813685248 is more than 2251799813685247, the most a counter holds"},
		{"override without unit", badUnit, "descriptors[0].limit.unit UNKNOWN is not a unit"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := s.ShouldRateLimit(context.Background(), tt.give)
			if !errors.Is(err, service.ErrInvalidRequest) || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("err = %v, want ErrInvalidRequest with %q", err, tt.wantErr)
			}
		})
	}
	none := service.New(nil, memstore.New(memstore.Options{}), nil, service.Options{})
	if _, err := none.ShouldRateLimit(context.Background(), request(desc("a", "b"))); !errors.Is(err, service.ErrNoRules) {
		t.Errorf("no rules: err = %v", err)
	}
}

func TestDetailedMetricCap(t *testing.T) {
	snap, err := config.Parse("d.yaml", []byte("domain: web\ndescriptors:\n  - key: ip\n    detailed_metric: true\n    rate_limit: {unit: hour, requests_per_unit: 100}\n"))
	if err != nil {
		t.Fatal(err)
	}
	m := metrics.New("test")
	s := service.New(snap, memstore.New(memstore.Options{}), nil, service.Options{Recorders: []record.Recorder{metrics.Recorder{M: m}}, DetailedMetricCap: 3})
	for i := range 10 {
		call(t, s, request(desc("ip", strconv.Itoa(i))))
	}
	if got := testutil.ToFloat64(m.Decisions.WithLabelValues("web", "web.ip_1", service.OutcomeOK)); got != 1 {
		t.Errorf("web.ip_1 = %v", got)
	}
	if got := testutil.ToFloat64(m.Decisions.WithLabelValues("web", "web.ip.<overflow>", service.OutcomeOK)); got != 7 {
		t.Errorf("overflow = %v, want 7", got)
	}
	if n := testutil.CollectAndCount(m.Decisions); n != 4 {
		t.Errorf("%d series, want 3 values + overflow", n)
	}
}
