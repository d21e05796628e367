package service_test

import (
	"context"
	"math"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/ratelimitd/ratelimitd/config"
	"github.com/ratelimitd/ratelimitd/internal/limit"
	"github.com/ratelimitd/ratelimitd/internal/memstore"
	"github.com/ratelimitd/ratelimitd/internal/metrics"
	"github.com/ratelimitd/ratelimitd/internal/overlimitcache"
	"github.com/ratelimitd/ratelimitd/internal/record"
	"github.com/ratelimitd/ratelimitd/internal/redisstore"
	"github.com/ratelimitd/ratelimitd/internal/redisstore/redistest"
	"github.com/ratelimitd/ratelimitd/internal/service"
)

const rulesYAML = `
domain: web
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 3}
  - key: ip
    rate_limit: {unit: hour, requests_per_unit: 100}
  - key: tight
    rate_limit: {unit: hour, requests_per_unit: 1}
  - key: zero
    rate_limit: {unit: hour, requests_per_unit: 0}
  - key: unl
    rate_limit:
      unlimited: true
      replaces: [{name: banned}]
  - key: banned
    rate_limit: {unit: hour, requests_per_unit: 0, name: banned}
  - key: shadow
    shadow_mode: true
    rate_limit: {unit: hour, requests_per_unit: 1}
  - key: files
    value: "a/*"
    share_threshold: true
    rate_limit: {unit: hour, requests_per_unit: 2}
  - key: q1
    quota_mode: true
    rate_limit: {unit: hour, requests_per_unit: 1}
  - key: q2
    quota_mode: true
    rate_limit: {unit: hour, requests_per_unit: 1}
  - key: whitelisted
    value: me
  - key: login
    failure_mode: deny
    rate_limit: {unit: minute, requests_per_unit: 5, name: login}
  - key: browse
    failure_mode: allow
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: parent
    value: p
    rate_limit: {unit: minute, requests_per_unit: 10}
    descriptors:
      - key: child
        rate_limit: {unit: second, requests_per_unit: 2, name: child-limit}
`

func rules(t testing.TB) *config.Snapshot {
	t.Helper()
	snap, err := config.Parse("rules.yaml", []byte(rulesYAML))
	if err != nil {
		t.Fatal(err)
	}
	return snap
}

// countingStore counts evaluations and can be made to fail.
type countingStore struct {
	service.Store
	calls atomic.Int64
	fail  atomic.Bool
}

func (c *countingStore) Evaluate(ctx context.Context, checks []limit.Check) ([]limit.Result, error) {
	c.calls.Add(1)
	if c.fail.Load() {
		return nil, redisstore.ErrUnavailable
	}
	return c.Store.Evaluate(ctx, checks)
}

// forEachStore runs f against the in-memory store and a real Redis.
func forEachStore(t *testing.T, f func(t *testing.T, st service.Store)) {
	t.Run("memstore", func(t *testing.T) { f(t, memstore.New(memstore.Options{})) })
	t.Run("redis", func(t *testing.T) {
		srv := redistest.Start(t)
		rs, err := redisstore.New(redisstore.Options{URL: srv.URL(), Timeout: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { rs.Close() })
		f(t, rs)
	})
}

func desc(kv ...string) *rlcommon.RateLimitDescriptor {
	d := &rlcommon.RateLimitDescriptor{}
	for i := 0; i+1 < len(kv); i += 2 {
		d.Entries = append(d.Entries, &rlcommon.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	return d
}

func request(ds ...*rlcommon.RateLimitDescriptor) *rlsv3.RateLimitRequest {
	return &rlsv3.RateLimitRequest{Domain: "web", Descriptors: ds}
}

func call(t *testing.T, s *service.Service, req *rlsv3.RateLimitRequest) *rlsv3.RateLimitResponse {
	t.Helper()
	resp, err := s.ShouldRateLimit(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.GetStatuses()) != len(req.GetDescriptors()) {
		t.Fatalf("%d statuses for %d descriptors", len(resp.GetStatuses()), len(req.GetDescriptors()))
	}
	return resp
}

func codes(resp *rlsv3.RateLimitResponse) string {
	var b strings.Builder
	b.WriteString(resp.GetOverallCode().String())
	for _, st := range resp.GetStatuses() {
		b.WriteString(" " + st.GetCode().String())
	}
	return b.String()
}

func TestFixedWindow(t *testing.T) {
	forEachStore(t, func(t *testing.T, st service.Store) {
		m := metrics.New("test")
		s := service.New(rules(t), st, nil, service.Options{Recorders: []record.Recorder{metrics.Recorder{M: m}}})
		for i, want := range []uint32{2, 1, 0} {
			resp := call(t, s, request(desc("user", "alice")))
			stt := resp.GetStatuses()[0]
			if resp.GetOverallCode() != rlsv3.RateLimitResponse_OK || stt.GetLimitRemaining() != want {
				t.Fatalf("call %d: %v remaining %d, want OK %d", i, codes(resp), stt.GetLimitRemaining(), want)
			}
			cl := stt.GetCurrentLimit()
			if cl.GetRequestsPerUnit() != 3 || cl.GetUnit() != rlsv3.RateLimitResponse_RateLimit_HOUR {
				t.Errorf("current_limit = %v", cl)
			}
			if d := stt.GetDurationUntilReset().AsDuration(); d < time.Second || d > time.Hour {
				t.Errorf("duration_until_reset = %v", d)
			}
		}
		resp := call(t, s, request(desc("user", "alice")))
		if codes(resp) != "OVER_LIMIT OVER_LIMIT" || resp.GetStatuses()[0].GetLimitRemaining() != 0 {
			t.Errorf("4th call = %v", resp)
		}
		// A key-only rule counts each value separately.
		if resp := call(t, s, request(desc("user", "bob"))); resp.GetStatuses()[0].GetLimitRemaining() != 2 {
			t.Errorf("bob shares alice's counter: %v", resp)
		}
		if got := testutil.ToFloat64(m.Requests.WithLabelValues("OVER_LIMIT")); got != 1 {
			t.Errorf("over-limit requests = %v", got)
		}
	})
}

func TestNoLimit(t *testing.T) {
	s := service.New(rules(t), memstore.New(memstore.Options{}), nil, service.Options{})
	tests := []struct {
		name string
		give *rlsv3.RateLimitRequest
	}{
		{"unknown key", request(desc("nope", "x"))},
		{"deeper than rules", request(desc("user", "a", "more", "b"))},
		{"whitelist", request(desc("whitelisted", "me"))},
		{"unknown domain", &rlsv3.RateLimitRequest{Domain: "other", Descriptors: []*rlcommon.RateLimitDescriptor{desc("user", "a")}}},
		{"override in unknown domain", &rlsv3.RateLimitRequest{Domain: "other", Descriptors: []*rlcommon.RateLimitDescriptor{{
			Entries: desc("user", "a").Entries, Limit: &rlcommon.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 0, Unit: typev3.RateLimitUnit_HOUR}}}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for range 3 {
				resp := call(t, s, tt.give)
				st := resp.GetStatuses()[0]
				if codes(resp) != "OK OK" || st.GetCurrentLimit() != nil || st.GetLimitRemaining() != 0 || st.GetDurationUntilReset() != nil {
					t.Fatalf("resp = %v, want OK with no limit", resp)
				}
			}
		})
	}
}

func TestUnlimitedAndReplaces(t *testing.T) {
	forEachStore(t, func(t *testing.T, st service.Store) {
		s := service.New(rules(t), st, nil, service.Options{})
		if resp := call(t, s, request(desc("banned", "x"))); codes(resp) != "OVER_LIMIT OVER_LIMIT" {
			t.Fatalf("banned alone = %v", codes(resp))
		}
		resp := call(t, s, request(desc("banned", "x"), desc("unl", "y")))
		if codes(resp) != "OK OK OK" {
			t.Fatalf("banned replaced = %v", codes(resp))
		}
		if st := resp.GetStatuses()[0]; st.GetCurrentLimit() != nil {
			t.Errorf("replaced status = %v, want no limit", st)
		}
		if st := resp.GetStatuses()[1]; st.GetLimitRemaining() != math.MaxUint32 || st.GetCurrentLimit() != nil {
			t.Errorf("unlimited status = %v", st)
		}
	})
}

// TestHitsAddend holds hits_addend's arithmetic under rejected_hits
// nothing (all or nothing for stated hits too); TestUsageCharges holds
// the default, usage.
func TestHitsAddend(t *testing.T) {
	forEachStore(t, func(t *testing.T, st service.Store) {
		s := service.New(rules(t), st, nil, service.Options{RejectedHits: config.RejectedNothing})
		// Request-level 0 means 1.
		req := request(desc("user", "h"))
		if r := call(t, s, req); r.GetStatuses()[0].GetLimitRemaining() != 2 {
			t.Fatalf("hits_addend 0: %v", r)
		}
		// An explicit per-descriptor 0 checks without consuming.
		peek := request(desc("user", "h"))
		peek.Descriptors[0].HitsAddend = wrapperspb.UInt64(0)
		for range 3 {
			if r := call(t, s, peek); r.GetStatuses()[0].GetLimitRemaining() != 2 || codes(r) != "OK OK" {
				t.Fatalf("peek: %v", r)
			}
		}
		// Request-level 3 is over a remaining 2 and consumes nothing.
		req.HitsAddend = 3
		if r := call(t, s, req); codes(r) != "OVER_LIMIT OVER_LIMIT" {
			t.Fatalf("hits 3 over 2 remaining: %v", codes(r))
		}
		req.HitsAddend = 2
		if r := call(t, s, req); codes(r) != "OK OK" || r.GetStatuses()[0].GetLimitRemaining() != 0 {
			t.Fatalf("hits 2 on 2 remaining: %v", r)
		}
		// The per-descriptor value wins over the request's.
		req.Descriptors[0].HitsAddend = wrapperspb.UInt64(0)
		if r := call(t, s, req); codes(r) != "OK OK" {
			t.Fatalf("peek at exhausted counter: %v", codes(r))
		}
	})
}

func TestRefund(t *testing.T) {
	forEachStore(t, func(t *testing.T, st service.Store) {
		s := service.New(rules(t), st, overlimitcache.New(1<<20), service.Options{})
		for range 3 {
			call(t, s, request(desc("user", "r")))
		}
		if r := call(t, s, request(desc("user", "r"))); codes(r) != "OVER_LIMIT OVER_LIMIT" {
			t.Fatalf("exhausted: %v", codes(r))
		}
		ref := request(desc("user", "r"))
		ref.Descriptors[0].IsNegativeHits = true
		ref.Descriptors[0].HitsAddend = wrapperspb.UInt64(2)
		if r := call(t, s, ref); codes(r) != "OK OK" || r.GetStatuses()[0].GetLimitRemaining() != 2 {
			t.Fatalf("refund of 2: %v", r)
		}
		// The refund also lifted the local block.
		if r := call(t, s, request(desc("user", "r"))); codes(r) != "OK OK" {
			t.Fatalf("after refund: %v", codes(r))
		}
		ref.Descriptors[0].HitsAddend = wrapperspb.UInt64(100)
		if r := call(t, s, ref); r.GetStatuses()[0].GetLimitRemaining() != 3 {
			t.Fatalf("refund below zero: %v", r)
		}
	})
}

func TestOverride(t *testing.T) {
	forEachStore(t, func(t *testing.T, st service.Store) {
		s := service.New(rules(t), st, overlimitcache.New(1<<20), service.Options{})
		ov := func(rpu uint32) *rlsv3.RateLimitRequest {
			d := desc("unconfigured", "v")
			d.Limit = &rlcommon.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: rpu, Unit: typev3.RateLimitUnit_MINUTE}
			return request(d)
		}
		for range 2 {
			if r := call(t, s, ov(2)); codes(r) != "OK OK" || r.GetStatuses()[0].GetCurrentLimit().GetUnit() != rlsv3.RateLimitResponse_RateLimit_MINUTE {
				t.Fatalf("override: %v", r)
			}
		}
		if r := call(t, s, ov(2)); codes(r) != "OVER_LIMIT OVER_LIMIT" {
			t.Fatalf("override exhausted: %v", codes(r))
		}
		// Another override value on the same entries shares the counter
		// (the key space does not grow with override values) but is not
		// blocked by the local cache entry made under limit 2.
		if r := call(t, s, ov(5)); codes(r) != "OK OK" || r.GetStatuses()[0].GetLimitRemaining() != 2 {
			t.Fatalf("override 5: %v", r)
		}
	})
}

func TestShadow(t *testing.T) {
	forEachStore(t, func(t *testing.T, st service.Store) {
		cs := &countingStore{Store: st}
		m := metrics.New("test")
		s := service.New(rules(t), cs, overlimitcache.New(1<<20), service.Options{Recorders: []record.Recorder{metrics.Recorder{M: m}}})
		for i := range 4 {
			r := call(t, s, request(desc("shadow", "x"), desc("ip", "1")))
			if codes(r) != "OK OK OK" {
				t.Fatalf("call %d: %v", i, codes(r))
			}
			if i > 0 && r.GetStatuses()[0].GetLimitRemaining() != 0 {
				t.Errorf("shadow remaining = %d", r.GetStatuses()[0].GetLimitRemaining())
			}
			// A shadow rule never vetoes: ip consumed every time.
			if got := r.GetStatuses()[1].GetLimitRemaining(); got != uint32(99-i) {
				t.Errorf("call %d: ip remaining %d, want %d", i, got, 99-i)
			}
		}
		if cs.calls.Load() != 4 {
			t.Errorf("store calls = %d, want 4: a shadow rule is never short-circuited", cs.calls.Load())
		}
		if got := outcomes(t, m, service.OutcomeShadow); got != 3 {
			t.Errorf("shadow decisions = %v, want 3", got)
		}
	})
}

func TestGlobalShadow(t *testing.T) {
	m := metrics.New("test")
	s := service.New(rules(t), memstore.New(memstore.Options{}), nil, service.Options{ShadowMode: true, Recorders: []record.Recorder{metrics.Recorder{M: m}}})
	if r := call(t, s, request(desc("zero", "x"))); codes(r) != "OK OVER_LIMIT" {
		t.Fatalf("global shadow = %v, want overall OK with the descriptor OVER_LIMIT", codes(r))
	}
	if got := testutil.ToFloat64(m.ShadowRequests); got != 1 {
		t.Errorf("shadow requests = %v, want 1", got)
	}
}

func TestAllOrNothing(t *testing.T) {
	forEachStore(t, func(t *testing.T, st service.Store) {
		s := service.New(rules(t), st, nil, service.Options{})
		call(t, s, request(desc("tight", "t")))
		for range 5 {
			if r := call(t, s, request(desc("ip", "9"), desc("tight", "t"))); codes(r) != "OVER_LIMIT OK OVER_LIMIT" {
				t.Fatalf("rejected request = %v", codes(r))
			}
		}
		if r := call(t, s, request(desc("ip", "9"))); r.GetStatuses()[0].GetLimitRemaining() != 99 {
			t.Errorf("ip remaining %d, want 99: rejected requests consumed it", r.GetStatuses()[0].GetLimitRemaining())
		}
	})
}

func TestLocalCache(t *testing.T) {
	forEachStore(t, func(t *testing.T, st service.Store) {
		cs := &countingStore{Store: st}
		m := metrics.New("test")
		s := service.New(rules(t), cs, overlimitcache.New(1<<20), service.Options{Recorders: []record.Recorder{metrics.Recorder{M: m}}})
		call(t, s, request(desc("tight", "c")))
		calls := cs.calls.Load()
		for range 3 {
			r := call(t, s, request(desc("tight", "c")))
			if codes(r) != "OVER_LIMIT OVER_LIMIT" || r.GetStatuses()[0].GetDurationUntilReset().GetSeconds() < 1 {
				t.Fatalf("cached = %v", r)
			}
		}
		if cs.calls.Load() != calls {
			t.Errorf("store called %d times for counters known exhausted", cs.calls.Load()-calls)
		}
		if got := outcomes(t, m, service.OutcomeLocalCache); got != 3 {
			t.Errorf("local cache answers = %v", got)
		}
		// With another descriptor, the others are read, not consumed.
		r := call(t, s, request(desc("ip", "c"), desc("tight", "c")))
		if codes(r) != "OVER_LIMIT OK OVER_LIMIT" || r.GetStatuses()[0].GetLimitRemaining() != 100 {
			t.Fatalf("mixed = %v", r)
		}
		// New rules empty the cache.
		s.SetRules(rules(t))
		call(t, s, request(desc("tight", "c")))
		if cs.calls.Load() == calls+1 {
			t.Error("no store call after a rules change")
		}
	})
}

// TestDuplicateDescriptors: a descriptor named twice in one request (two
// QuotaPolicies on one backend, say) counts each occurrence, and each is
// answered as the incumbent answers it, in turn: the first with the
// second's hit still left. Refused, the request consumes nothing (all or
// nothing), though its first occurrence alone would have fit.
func TestDuplicateDescriptors(t *testing.T) {
	forEachStore(t, func(t *testing.T, st service.Store) {
		s := service.New(rules(t), st, nil, service.Options{})
		r := call(t, s, request(desc("user", "d"), desc("user", "d")))
		if codes(r) != "OK OK OK" || r.GetStatuses()[0].GetLimitRemaining() != 2 || r.GetStatuses()[1].GetLimitRemaining() != 1 {
			t.Fatalf("two hits on one counter: %v", r)
		}
		r = call(t, s, request(desc("user", "d"), desc("user", "d")))
		if codes(r) != "OVER_LIMIT OK OVER_LIMIT" || r.GetStatuses()[0].GetLimitRemaining() != 0 {
			t.Fatalf("two more hits on 1 remaining: %v", r)
		}
		if r := call(t, s, request(desc("user", "d"))); codes(r) != "OK OK" {
			t.Fatalf("the rejected pair consumed: %v", codes(r))
		}
	})
}

func TestShareThresholdAndNesting(t *testing.T) {
	forEachStore(t, func(t *testing.T, st service.Store) {
		s := service.New(rules(t), st, nil, service.Options{})
		call(t, s, request(desc("files", "a/1")))
		call(t, s, request(desc("files", "a/2")))
		if r := call(t, s, request(desc("files", "a/3"))); codes(r) != "OVER_LIMIT OVER_LIMIT" {
			t.Fatalf("shared counter: %v", codes(r))
		}
		r := call(t, s, request(desc("parent", "p"), desc("parent", "p", "child", "c")))
		if cl := r.GetStatuses()[1].GetCurrentLimit(); cl.GetName() != "child-limit" || cl.GetRequestsPerUnit() != 2 {
			t.Fatalf("child limit = %v", cl)
		}
		if cl := r.GetStatuses()[0].GetCurrentLimit(); cl.GetRequestsPerUnit() != 10 || cl.GetUnit() != rlsv3.RateLimitResponse_RateLimit_MINUTE {
			t.Fatalf("parent limit = %v", cl)
		}
	})
}

func TestQuotaMode(t *testing.T) {
	s := service.New(rules(t), memstore.New(memstore.Options{}), nil, service.Options{})
	call(t, s, request(desc("q1", "x")))
	if r := call(t, s, request(desc("q1", "x"), desc("q2", "x"))); codes(r) != "OK OVER_LIMIT OK" {
		t.Fatalf("one quota over = %v", codes(r))
	}
	if r := call(t, s, request(desc("q1", "x"), desc("q2", "x"))); codes(r) != "OVER_LIMIT OVER_LIMIT OVER_LIMIT" {
		t.Fatalf("all quotas over = %v", codes(r))
	}
}
