package rlqstest

import (
	"errors"
	"testing"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// fake is a scripted RLQS server: it records reports, and the test sends
// what the server would.
type fake struct {
	reports []*rlqsv3.RateLimitQuotaUsageReports
	deliver func(*rlqsv3.RateLimitQuotaResponse)
	closed  func(error)
	dials   int
	refuse  bool
}

type fakeConn struct{ f *fake }

func (c fakeConn) Send(r *rlqsv3.RateLimitQuotaUsageReports) error {
	c.f.reports = append(c.f.reports, r)
	return nil
}
func (c fakeConn) Close() {}

func (f *fake) dial(deliver func(*rlqsv3.RateLimitQuotaResponse), closed func(error)) (Conn, error) {
	if f.refuse {
		return nil, errors.New("connection refused")
	}
	f.dials++
	f.deliver, f.closed = deliver, closed
	return fakeConn{f}, nil
}

// push delivers resp and has e apply it at now.
func (f *fake) push(e *Envoy, now time.Time, resp *rlqsv3.RateLimitQuotaResponse) {
	f.deliver(resp)
	e.Tick(now)
}

func (f *fake) last(t *testing.T) *rlqsv3.RateLimitQuotaUsageReports {
	t.Helper()
	if len(f.reports) == 0 {
		t.Fatal("no report sent")
	}
	return f.reports[len(f.reports)-1]
}

var (
	t0  = time.Unix(1_700_000_000, 0)
	bkt = map[string]string{"environment": "staging", "group": "envoy"}
)

func at(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }

func blanket(r typev3.RateLimitStrategy_BlanketRule) *typev3.RateLimitStrategy {
	return &typev3.RateLimitStrategy{Strategy: &typev3.RateLimitStrategy_BlanketRule_{BlanketRule: r}}
}

func tokens(max, perFill uint32, every time.Duration) *typev3.RateLimitStrategy {
	return &typev3.RateLimitStrategy{Strategy: &typev3.RateLimitStrategy_TokenBucket{TokenBucket: &typev3.TokenBucket{
		MaxTokens: max, TokensPerFill: wrapperspb.UInt32(perFill), FillInterval: durationpb.New(every)}}}
}

func assign(id map[string]string, s *typev3.RateLimitStrategy, ttl *durationpb.Duration) *rlqsv3.RateLimitQuotaResponse {
	return &rlqsv3.RateLimitQuotaResponse{BucketAction: []*rlqsv3.RateLimitQuotaResponse_BucketAction{{
		BucketId: &rlqsv3.BucketId{Bucket: id},
		BucketAction: &rlqsv3.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction_{
			QuotaAssignmentAction: &rlqsv3.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction{
				AssignmentTimeToLive: ttl, RateLimitStrategy: s}},
	}}}
}

func usage(t *testing.T, r *rlqsv3.RateLimitQuotaUsageReports, i int, allowed, denied uint64, elapsed int64) {
	t.Helper()
	if len(r.GetBucketQuotaUsages()) <= i {
		t.Fatalf("report has %d buckets, want more than %d", len(r.GetBucketQuotaUsages()), i)
	}
	u := r.GetBucketQuotaUsages()[i]
	if u.GetNumRequestsAllowed() != allowed || u.GetNumRequestsDenied() != denied || u.GetTimeElapsed().GetSeconds() != elapsed {
		t.Fatalf("usage %d = allowed %d denied %d elapsed %ds, want %d %d %ds", i,
			u.GetNumRequestsAllowed(), u.GetNumRequestsDenied(), u.GetTimeElapsed().GetSeconds(), allowed, denied, elapsed)
	}
}

// The tests below hold the simulation to what Envoy's own integration
// test (test/extensions/filters/http/rate_limit_quota/integration_test.cc)
// expects of the filter, case by case.

// BasicFlowMultiSameRequest, BasicFlowPeriodicalReport: a new bucket is
// allowed by default and reported at once; the same bucket again is not;
// then every bucket every 5 s, with the counts since the last report.
func TestBasicFlow(t *testing.T) {
	f := &fake{}
	e := New(Settings{Domain: "cloud_12345_67890_rlqs"}, f.dial)
	if !e.Request(at(0), bkt) {
		t.Fatal("first request denied under the default no_assignment_behavior")
	}
	if f.dials != 1 || len(f.reports) != 1 {
		t.Fatalf("dials %d reports %d, want one stream and one report", f.dials, len(f.reports))
	}
	r := f.last(t)
	if r.GetDomain() != "cloud_12345_67890_rlqs" || len(r.GetBucketQuotaUsages()) != 1 {
		t.Fatalf("initial report = %v", r)
	}
	usage(t, r, 0, 1, 0, 0)
	f.deliver(assign(map[string]string{"environment": "staging", "group": "envoy", "name": "prod"}, nil, nil)) // matches no bucket
	for range 2 {
		if !e.Request(at(1), bkt) {
			t.Fatal("same bucket denied")
		}
	}
	if len(f.reports) != 1 {
		t.Fatalf("%d reports, want none for a known bucket", len(f.reports))
	}
	e.Tick(at(5))
	usage(t, f.last(t), 0, 2, 0, 5)
	for i := range 10 {
		e.Tick(at(10 + 5*float64(i)))
		usage(t, f.last(t), 0, 0, 0, 5)
	}
	if f.dials != 1 {
		t.Errorf("%d streams, want one", f.dials)
	}
}

// MultiDifferentRequestNoAssignementAllowAll / DenyAll: each new bucket
// is reported alone, right away, decided by no_assignment_behavior.
func TestNoAssignment(t *testing.T) {
	for _, rule := range []typev3.RateLimitStrategy_BlanketRule{typev3.RateLimitStrategy_ALLOW_ALL, typev3.RateLimitStrategy_DENY_ALL} {
		f := &fake{}
		e := New(Settings{Domain: "d", NoAssignment: rule}, f.dial)
		allowed := rule == typev3.RateLimitStrategy_ALLOW_ALL
		var a, d uint64 = 1, 0
		if !allowed {
			a, d = 0, 1
		}
		for i := range 5 {
			id := map[string]string{"environment": "staging", "group": "envoy_" + string(rune('0'+i))}
			if got := e.Request(at(float64(i)*0.1), id); got != allowed {
				t.Fatalf("%v: request %d allowed=%v", rule, i, got)
			}
			if len(f.reports) != i+1 || len(f.last(t).GetBucketQuotaUsages()) != 1 {
				t.Fatalf("%v: request %d: %d reports, last %v", rule, i, len(f.reports), f.last(t))
			}
			usage(t, f.last(t), 0, a, d, 0)
		}
		if e.Request(at(1), map[string]string{"environment": "staging", "group": "envoy_0"}) != allowed {
			t.Errorf("%v: a known bucket without assignment decided otherwise", rule)
		}
	}
}

// MultiRequestWithTokenBucket, DISABLED_MultiRequestWithTokenBucketThrottling:
// max 1 token, 30 per 60 s: one request, then one more per 2 s.
func TestTokenBucket(t *testing.T) {
	f := &fake{}
	e := New(Settings{Domain: "d"}, f.dial)
	e.Request(at(0), bkt)
	f.push(e, at(0), assign(bkt, tokens(1, 30, time.Minute), durationpb.New(120*time.Second)))
	want := []struct {
		at float64
		ok bool
	}{{0.1, true}, {0.2, false}, {2.3, true}, {2.4, false}, {4.5, true}, {4.6, false}}
	for _, w := range want {
		if got := e.Request(at(w.at), bkt); got != w.ok {
			t.Fatalf("request at %.1fs allowed=%v, want %v", w.at, got, w.ok)
		}
	}
	// The same settings again keep the tokens; other settings scale them.
	f.push(e, at(4.6), assign(bkt, tokens(1, 30, time.Minute), durationpb.New(120*time.Second)))
	if e.Request(at(4.7), bkt) {
		t.Error("re-sent identical bucket came back full")
	}
	e.Request(at(5.1), bkt)
	old := e.Tokens(bkt)
	f.push(e, at(5.1), assign(bkt, tokens(10, 1, time.Hour), durationpb.New(120*time.Second)))
	if got := e.Tokens(bkt); old <= 0 || old >= 1 || got < 10*old-1e-9 || got > 10*old+1e-9 {
		t.Errorf("tokens after new settings = %.3f, want 10 × %.3f/1", got, old)
	}
	f.deliver(assign(bkt, blanket(typev3.RateLimitStrategy_DENY_ALL), durationpb.New(120*time.Second)))
	f.push(e, at(5.2), assign(bkt, tokens(7, 1, time.Hour), durationpb.New(120*time.Second)))
	if got := e.Tokens(bkt); got != 7 {
		t.Errorf("tokens after a DENY_ALL then a bucket = %.2f, want a full 7", got)
	}
}

// MultiRequestWithUnsupportedStrategy: requests_per_time_unit, and an
// assignment without strategy, are ignored: the assignment in force (here
// a DENY_ALL, so that ignoring shows) stays.
func TestUnsupportedStrategy(t *testing.T) {
	f := &fake{}
	e := New(Settings{Domain: "d"}, f.dial)
	if !e.Request(at(0), bkt) {
		t.Fatal("first request denied under the default no_assignment_behavior")
	}
	f.push(e, at(0), assign(bkt, blanket(typev3.RateLimitStrategy_DENY_ALL), durationpb.New(time.Minute)))
	f.deliver(assign(bkt, &typev3.RateLimitStrategy{Strategy: &typev3.RateLimitStrategy_RequestsPerTimeUnit_{
		RequestsPerTimeUnit: &typev3.RateLimitStrategy_RequestsPerTimeUnit{RequestsPerTimeUnit: 100, TimeUnit: typev3.RateLimitUnit_SECOND}}},
		durationpb.New(time.Minute)))
	f.push(e, at(0), assign(bkt, &typev3.RateLimitStrategy{}, durationpb.New(time.Minute)))
	for i := range 3 {
		if e.Request(at(1+float64(i)), bkt) {
			t.Fatal("an unsupported strategy took effect: the DENY_ALL in force was replaced")
		}
	}
}

// MultiSameRequestWithExpiredAssignmentDeny/Allow,
// MultiSameRequestWithExpirationToDefaultDeny, ...WithoutFallback.
func TestExpiry(t *testing.T) {
	deny, allow := typev3.RateLimitStrategy_DENY_ALL, typev3.RateLimitStrategy_ALLOW_ALL
	t.Run("expired deny", func(t *testing.T) {
		f := &fake{}
		e := New(Settings{Domain: "d", Expired: blanket(deny), ExpiredFor: time.Minute}, f.dial)
		e.Request(at(0), bkt)
		f.push(e, at(0), assign(bkt, blanket(allow), durationpb.New(10*time.Second)))
		if !e.Request(at(9), bkt) || e.Request(at(12), bkt) {
			t.Error("want allowed at 9s, denied at 12s once the assignment expired")
		}
	})
	t.Run("expired allow", func(t *testing.T) {
		f := &fake{}
		e := New(Settings{Domain: "d", NoAssignment: deny, Expired: blanket(allow), ExpiredFor: time.Minute}, f.dial)
		e.Request(at(0), bkt)
		f.push(e, at(0), assign(bkt, blanket(allow), durationpb.New(2*time.Second)))
		if !e.Request(at(3), bkt) {
			t.Error("denied after expiry with expired_assignment_behavior ALLOW_ALL")
		}
	})
	t.Run("fallback then default", func(t *testing.T) {
		f := &fake{}
		e := New(Settings{Domain: "d", NoAssignment: allow, Expired: blanket(deny), ExpiredFor: 15 * time.Second}, f.dial)
		if !e.Request(at(0), bkt) {
			t.Fatal("query 1 denied by default")
		}
		f.push(e, at(0), assign(bkt, blanket(deny), durationpb.New(15*time.Second)))
		if e.Request(at(10), bkt) || e.Request(at(20), bkt) || !e.Request(at(35), bkt) {
			t.Error("want denied by assignment (10s), by expiry fallback (20s), allowed by default (35s)")
		}
	})
	t.Run("without fallback", func(t *testing.T) {
		f := &fake{}
		e := New(Settings{Domain: "d", NoAssignment: allow}, f.dial)
		e.Request(at(0), bkt)
		f.push(e, at(0), assign(bkt, blanket(deny), durationpb.New(15*time.Second)))
		if e.Request(at(10), bkt) || !e.Request(at(16), bkt) {
			t.Error("want denied by assignment, then the default at once on expiry")
		}
	})
	t.Run("unset TTL expires at once", func(t *testing.T) {
		f := &fake{}
		e := New(Settings{Domain: "d", NoAssignment: allow}, f.dial)
		e.Request(at(0), bkt)
		f.push(e, at(0), assign(bkt, blanket(deny), nil))
		if !e.Request(at(0.5), bkt) {
			t.Error("an assignment without TTL took effect")
		}
		f.push(e, at(0.5), assign(bkt, blanket(deny), &durationpb.Duration{Nanos: 900_000_000}))
		if !e.Request(at(0.6), bkt) {
			t.Error("a TTL under a second did not count as zero whole seconds")
		}
	})
}

// BasicFlowPeriodicalReportWithStreamClosed: a closed stream is reopened
// at the next report; reports made while it cannot be are dropped.
func TestStreamClosed(t *testing.T) {
	f := &fake{}
	e := New(Settings{Domain: "d"}, f.dial)
	e.Request(at(0), bkt)
	f.closed(errors.New("canceled"))
	f.refuse = true
	e.Request(at(1), bkt)
	e.Tick(at(5)) // cannot reopen: dropped, counts lost
	if s := e.Stats(); s.Dropped != 1 || s.Reports != 1 {
		t.Fatalf("stats %+v, want one report sent and one dropped", s)
	}
	f.refuse = false
	e.Request(at(6), bkt)
	e.Tick(at(10))
	if f.dials != 2 {
		t.Fatalf("%d dials, want the stream reopened at the report", f.dials)
	}
	usage(t, f.last(t), 0, 1, 0, 5) // the request at 1s was in the dropped report
	if len(f.reports) != 2 {
		t.Errorf("%d reports reached the server, want 2 (none resent)", len(f.reports))
	}
}

// MultiSameRequestWithAbandonAction: an abandoned bucket is erased and
// reported no more; its next request makes it new, reported at once.
func TestAbandon(t *testing.T) {
	f := &fake{}
	e := New(Settings{Domain: "d"}, f.dial)
	e.Request(at(0), bkt)
	f.push(e, at(0), &rlqsv3.RateLimitQuotaResponse{BucketAction: []*rlqsv3.RateLimitQuotaResponse_BucketAction{{
		BucketId:     &rlqsv3.BucketId{Bucket: bkt},
		BucketAction: &rlqsv3.RateLimitQuotaResponse_BucketAction_AbandonAction_{AbandonAction: &rlqsv3.RateLimitQuotaResponse_BucketAction_AbandonAction{}},
	}}})
	e.Tick(at(5))
	if e.Buckets() != 0 || len(f.last(t).GetBucketQuotaUsages()) != 0 {
		t.Fatalf("after abandon: %d buckets, report %v", e.Buckets(), f.last(t))
	}
	n := len(f.reports)
	e.Request(at(6), bkt)
	if len(f.reports) != n+1 {
		t.Fatal("the abandoned bucket's next request sent no report")
	}
	usage(t, f.last(t), 0, 1, 0, 0)
}
