package rlqs_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/ratelimitd/ratelimitd/config"
	"github.com/ratelimitd/ratelimitd/internal/limit"
	"github.com/ratelimitd/ratelimitd/internal/memstore"
	"github.com/ratelimitd/ratelimitd/internal/rlqs"
	"github.com/ratelimitd/ratelimitd/internal/service"
)

func unitServer(t *testing.T, rules string, store rlqs.Granter, opts rlqs.Options) (*rlqs.Server, *rlqs.Metrics) {
	t.Helper()
	snap, err := config.Parse("rules.yaml", []byte(rules))
	if err != nil {
		t.Fatal(err)
	}
	if store == nil {
		store = memstore.New(memstore.Options{})
	}
	m := rlqs.NewMetrics(prometheus.NewRegistry())
	opts.Metrics = m
	svc := service.New(snap, store.(service.Store), nil, service.Options{})
	return rlqs.New(svc, store, opts), m
}

const kindsRules = `
domain: edge
rlqs: {descriptor_keys: [tenant, route]}
descriptors:
  - key: tenant
    value: vip
    rate_limit: {unlimited: true}
  - key: tenant
    value: trial
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: tenant
    rate_limit: {unit: hour, requests_per_unit: 100}
    descriptors:
      - key: route
        value: login
        failure_mode: deny
        rate_limit: {unit: minute, requests_per_unit: 1000}
---
domain: plain
descriptors:
  - key: tenant
    rate_limit: {unit: minute, requests_per_unit: 1}
`

func report(domain string, ids ...map[string]string) *rlqsv3.RateLimitQuotaUsageReports {
	r := &rlqsv3.RateLimitQuotaUsageReports{Domain: domain}
	for _, id := range ids {
		r.BucketQuotaUsages = append(r.BucketQuotaUsages, &rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{
			BucketId: &rlqsv3.BucketId{Bucket: id}, NumRequestsAllowed: 1})
	}
	return r
}

// actions renders a response's actions as "kind/ttl" per bucket, in order.
func actions(resp *rlqsv3.RateLimitQuotaResponse) string {
	var out []string
	for _, a := range resp.GetBucketAction() {
		qa := a.GetQuotaAssignmentAction()
		s := qa.GetRateLimitStrategy()
		kind := "abandon"
		switch {
		case s.GetTokenBucket() != nil:
			kind = "tokens"
		case qa != nil && s.GetBlanketRule() == typev3.RateLimitStrategy_DENY_ALL:
			kind = "deny"
		case qa != nil:
			kind = "allow"
		}
		if qa != nil {
			kind += "/" + qa.GetAssignmentTimeToLive().AsDuration().String()
		}
		out = append(out, kind)
	}
	return strings.Join(out, " ")
}

// counts reports one usage of id on ss at now and returns the response.
func counts(t *testing.T, ss *rlqs.Session, now time.Time, domain string, id map[string]string, allowed, denied uint64) *rlqsv3.RateLimitQuotaResponse {
	t.Helper()
	r := report(domain, id)
	r.BucketQuotaUsages[0].NumRequestsAllowed, r.BucketQuotaUsages[0].NumRequestsDenied = allowed, denied
	resp, err := ss.Report(context.Background(), now, r)
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

// granted is the size of the token bucket a response ends with (0: none).
func granted(resp *rlqsv3.RateLimitQuotaResponse) uint32 {
	as := resp.GetBucketAction()
	if len(as) == 0 {
		return 0
	}
	return as[len(as)-1].GetQuotaAssignmentAction().GetRateLimitStrategy().GetTokenBucket().GetMaxTokens()
}

var t0 = time.Unix(1_800_000_000, 0).Truncate(time.Hour)

// twoSessions opens two sessions, closed when the test ends, on a server
// of rules whose memstore reads the clock *now.
func twoSessions(t *testing.T, rules string, now *time.Time) (*rlqs.Session, *rlqs.Session) {
	t.Helper()
	srv, _ := unitServer(t, rules, memstore.New(memstore.Options{Now: func() time.Time { return *now }}), rlqs.Options{})
	a, _ := srv.NewSession()
	t.Cleanup(a.Close)
	b, _ := srv.NewSession()
	t.Cleanup(b.Close)
	return a, b
}

// TestKinds: what each kind of bucket is assigned.
func TestKinds(t *testing.T) {
	store := memstore.New(memstore.Options{Now: func() time.Time { return t0.Add(10 * time.Second) }})
	srv, _ := unitServer(t, kindsRules, store, rlqs.Options{})
	ss, err := srv.NewSession()
	if err != nil {
		t.Fatal(err)
	}
	defer ss.Close()
	now := t0.Add(10 * time.Second)
	for _, tt := range []struct {
		id   map[string]string
		want string
	}{
		{map[string]string{"tenant": "vip"}, "allow/1m0s"},                                   // unlimited
		{map[string]string{"tenant": "trial"}, "allow/1m0s"},                                 // shadow mode
		{map[string]string{"other": "x"}, "allow/1m0s"},                                      // no rlqs key: no rule
		{map[string]string{"tenant": "acme", "route": "login", "env": "prod"}, "tokens/49s"}, // minute window, 50 s left, 1 s margin
		{map[string]string{"tenant": "acme"}, "tokens/59m49s"},                               // hour window
	} {
		resp, err := ss.Report(context.Background(), now, report("edge", tt.id))
		if err != nil {
			t.Fatal(err)
		}
		if got := actions(resp); got != tt.want {
			t.Errorf("%v: %q, want %q", tt.id, got, tt.want)
		}
	}
	plain, _ := srv.NewSession()
	defer plain.Close()
	if resp, _ := plain.Report(context.Background(), now, report("plain", map[string]string{"tenant": "a"})); actions(resp) != "allow/1m0s" {
		t.Errorf("a domain without rlqs keys: %q, want allow", actions(resp))
	}
}

// failing is a store that cannot grant.
type failing struct{ *memstore.Store }

func (failing) Grant(context.Context, []limit.GrantOp) ([]limit.GrantResult, error) {
	return nil, errors.New("redis down")
}

// flaky is a store whose grants fail while down is set.
type flaky struct {
	*memstore.Store
	down atomic.Bool
}

func (f *flaky) Grant(ctx context.Context, ops []limit.GrantOp) ([]limit.GrantResult, error) {
	if f.down.Load() {
		return nil, errors.New("redis timeout")
	}
	return f.Store.Grant(ctx, ops)
}

// TestFailureMode: a store that cannot grant answers by the rule's
// failure mode, for as long as grants have been failing (a second at
// first, FailureTTL at most), and the session asks the store again
// halfway through; once grants succeed again the next failure starts
// at a second.
func TestFailureMode(t *testing.T) {
	srv, m := unitServer(t, kindsRules, failing{memstore.New(memstore.Options{})}, rlqs.Options{FailureTTL: 7 * time.Second})
	ss, _ := srv.NewSession()
	defer ss.Close()
	ids := []map[string]string{{"tenant": "a", "route": "login"}, {"tenant": "a"}}
	for _, step := range []struct {
		at   time.Duration
		want string
	}{
		{0, "deny/1s allow/1s"},
		{3 * time.Second, "deny/4s allow/4s"},
		{30 * time.Second, "deny/7s allow/7s"},
	} {
		resp, _ := ss.Report(context.Background(), t0.Add(step.at), report("edge", ids...))
		if got := actions(resp); got != step.want {
			t.Errorf("failing for %v: answers %q, want %q (login: failure_mode deny, then the default allow)", step.at, got, step.want)
		}
	}
	if n := testutil.ToFloat64(m.RLQSGrants.WithLabelValues("failed")); n != 6 {
		t.Errorf("failed grants = %v, want 6", n)
	}
	if w := ss.NextWake(); !w.Equal(t0.Add(30*time.Second + 3500*time.Millisecond)) {
		t.Errorf("next wake %v, want halfway through the last answer", w.Sub(t0))
	}

	st := &flaky{Store: memstore.New(memstore.Options{Now: func() time.Time { return t0 }})}
	srv2, _ := unitServer(t, kindsRules, st, rlqs.Options{FailureTTL: 7 * time.Second})
	s2, _ := srv2.NewSession()
	defer s2.Close()
	if resp := counts(t, s2, t0, "edge", map[string]string{"tenant": "b"}, 10, 0); granted(resp) == 0 {
		t.Fatalf("a grant first: %q", actions(resp))
	}
	st.down.Store(true)
	if got := actions(counts(t, s2, t0.Add(6*time.Second), "edge", map[string]string{"tenant": "c"}, 1, 0)); got != "allow/1s" {
		t.Errorf("at the failure's start: %q, want allow/1s", got)
	}
	if got := actions(counts(t, s2, t0.Add(8*time.Second), "edge", map[string]string{"tenant": "d"}, 1, 0)); got != "allow/3s" {
		t.Errorf("two seconds into the failure: %q, want allow/3s", got)
	}
	st.down.Store(false)
	counts(t, s2, t0.Add(9*time.Second), "edge", map[string]string{"tenant": "e"}, 1, 0)
	st.down.Store(true)
	if got := actions(counts(t, s2, t0.Add(10*time.Second), "edge", map[string]string{"tenant": "f"}, 1, 0)); got != "allow/1s" {
		t.Errorf("a failure after grants succeeded again: %q, want allow/1s", got)
	}
}

// TestFailureKeepsHeldTokens: a grant that fails while the Envoy still
// holds tokens of the last one answers nothing: the failure mode would
// throw the tokens away (DENY_ALL) or lift the limit (ALLOW_ALL) for a
// hiccup; the session asks again a second later, and answers by the
// failure mode once the tokens are spent.
func TestFailureKeepsHeldTokens(t *testing.T) {
	now := t0.Add(time.Second)
	st := &flaky{Store: memstore.New(memstore.Options{Now: func() time.Time { return now }})}
	srv, _ := unitServer(t, kindsRules, st, rlqs.Options{})
	a, _ := srv.NewSession()
	defer a.Close()
	b, _ := srv.NewSession()
	defer b.Close()
	id := map[string]string{"tenant": "acme", "route": "login"} // 1000 a minute, failure_mode deny
	counts(t, a, now, "edge", id, 1, 0)
	counts(t, b, now, "edge", id, 1, 100_000)
	now = now.Add(5 * time.Second)
	counts(t, b, now, "edge", id, 416, 500_000)
	// a has used 150 of its 167 and runs short with the counter drained:
	// its grant is kept until its tokens are expected spent.
	if got := actions(counts(t, a, now, "edge", id, 150, 0)); got != "" {
		t.Fatalf("a running short: %q, want no action", got)
	}
	st.down.Store(true)
	now = a.NextWake().Truncate(time.Millisecond).Add(time.Millisecond)
	if resp := a.Wake(context.Background(), now); resp != nil {
		t.Fatalf("a woken to renew its grant, the store failing, 17 tokens held: %q, want no action", actions(resp))
	}
	if w := a.NextWake(); !w.Equal(now.Add(time.Second)) {
		t.Errorf("a's next wake %v, want a second later (%v)", w, now.Add(time.Second))
	}
	// Its tokens reported spent, the failure mode answers, for as long
	// as grants have failed (a second) and a second more. Of the 150
	// reported over the period the grant arrived in, 75 count as surely
	// spent from it: it may have arrived a margin (a second) after it
	// was sent, and the report may have been made a margin before it
	// reached the server. 92 more spend it surely.
	if got := actions(counts(t, a, now.Add(time.Second), "edge", id, 91, 0)); got != "" {
		t.Errorf("a with a token it may hold, the store failing: %q, want no action", got)
	}
	if got := actions(counts(t, a, now.Add(time.Second), "edge", id, 1, 0)); got != "deny/2s" {
		t.Errorf("a with its tokens spent, the store failing a second: %q, want deny/2s", got)
	}
}

// TestBounds: what is refused, and how.
func TestBounds(t *testing.T) {
	srv, m := unitServer(t, kindsRules, nil, rlqs.Options{MaxStreams: 2, MaxBuckets: 3, MaxBucketIDBytes: 64})
	a, err := srv.NewSession()
	if err != nil {
		t.Fatal(err)
	}
	b, _ := srv.NewSession()
	if _, err := srv.NewSession(); !errors.Is(err, rlqs.ErrTooManyStreams) {
		t.Errorf("third stream: %v, want ErrTooManyStreams", err)
	}
	b.Close()
	b.Close() // twice is harmless
	c, err := srv.NewSession()
	if err != nil {
		t.Fatalf("a stream after one closed: %v", err)
	}
	defer c.Close()
	defer a.Close()
	ctx := context.Background()
	if _, err := c.Report(ctx, t0, report("")); err == nil || !strings.Contains(err.Error(), "must name the domain") {
		t.Errorf("first report without domain: %v", err)
	}
	if _, err := a.Report(ctx, t0, report("edge")); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Report(ctx, t0, report("plain")); err == nil || !strings.Contains(err.Error(), `report for domain "plain" on a stream of domain "edge"`) {
		t.Errorf("domain change: %v", err)
	}
	resp, _ := a.Report(ctx, t0, report("", map[string]string{}, map[string]string{"tenant": strings.Repeat("x", 100)}, map[string]string{"tenant": "1"}))
	if got := len(resp.GetBucketAction()); got != 1 {
		t.Errorf("%d buckets assigned, want 1 (empty and oversized ids refused)", got)
	}
	resp, _ = a.Report(ctx, t0, report("", map[string]string{"tenant": "2"}, map[string]string{"tenant": "3"}, map[string]string{"tenant": "4"}))
	if got := len(resp.GetBucketAction()); got != 2 {
		t.Errorf("%d buckets assigned, want 2 (a fourth bucket is one too many)", got)
	}
	// A report of more buckets than MaxBuckets is answered for the
	// buckets within the bound (the known ones, here running out of
	// their grants), the new ones past it refused one by one.
	big := report("edge", map[string]string{"tenant": "9"}, map[string]string{"tenant": "1"}, map[string]string{"tenant": "8"}, map[string]string{"tenant": "2"})
	for _, u := range big.GetBucketQuotaUsages() {
		u.NumRequestsAllowed = 5
	}
	resp, _ = a.Report(ctx, t0.Add(5*time.Second), big)
	answered := map[string]bool{}
	for _, act := range resp.GetBucketAction() {
		answered[act.GetBucketId().GetBucket()["tenant"]] = true
	}
	if !answered["1"] || !answered["2"] || answered["8"] || answered["9"] {
		t.Errorf("a report of 4 buckets, 2 of them new past the bound: answered %v, want tenants 1 and 2", answered)
	}
	for reason, want := range map[string]float64{"too_many_streams": 1, "bad_domain": 2, "bucket_id_empty": 1, "bucket_id_too_large": 1, "too_many_buckets": 3} {
		if got := testutil.ToFloat64(m.RLQSRejected.WithLabelValues(reason)); got != want {
			t.Errorf("rejected %s = %v, want %v", reason, got, want)
		}
	}
	if got := testutil.ToFloat64(m.RLQSStreams); got != 2 {
		t.Errorf("streams gauge = %v, want 2", got)
	}
	if got := testutil.ToFloat64(m.RLQSBuckets); got != 3 {
		t.Errorf("buckets gauge = %v, want 3", got)
	}
}

// TestFreshBucketEachGrant: a grant replacing a token bucket is preceded
// by DENY_ALL (Envoy would carry tokens over otherwise), and a grant
// never starts in a window's last Margin and second: it is given back
// and the bucket denied until the window ends.
func TestFreshBucketEachGrant(t *testing.T) {
	now := t0.Add(10 * time.Second)
	store := memstore.New(memstore.Options{Now: func() time.Time { return now }})
	srv, m := unitServer(t, kindsRules, store, rlqs.Options{})
	ss, _ := srv.NewSession()
	defer ss.Close()
	id := map[string]string{"tenant": "acme", "route": "login"}
	ctx := context.Background()
	resp, _ := ss.Report(ctx, now, report("edge", id))
	if got := actions(resp); got != "tokens/49s" {
		t.Fatalf("first grant %q", got)
	}
	granted := resp.GetBucketAction()[0].GetQuotaAssignmentAction().GetRateLimitStrategy().GetTokenBucket()
	if fill := granted.GetFillInterval().AsDuration(); granted.GetTokensPerFill().GetValue() != 1 || fill != 50*time.Second {
		t.Errorf("refill %d per %v, want 1 per TTL + 1 s", granted.GetTokensPerFill().GetValue(), fill)
	}
	now = now.Add(5 * time.Second)
	u := report("edge", id)
	u.BucketQuotaUsages[0].NumRequestsAllowed = uint64(granted.GetMaxTokens())
	u.BucketQuotaUsages[0].NumRequestsDenied = 20
	if resp, _ = ss.Report(ctx, now, u); actions(resp) != "deny/44s tokens/44s" {
		t.Errorf("spent grant replaced by %q, want deny then a fresh bucket", actions(resp))
	}
	now = t0.Add(58*time.Second + 500*time.Millisecond)
	u.BucketQuotaUsages[0].NumRequestsAllowed = 1000
	snap, _ := config.Parse("rules.yaml", []byte(kindsRules))
	plan, _ := service.New(snap, store, nil, service.Options{}).PlanBucket("edge", []*rlcommon.RateLimitDescriptor_Entry{
		{Key: "tenant", Value: "acme"}, {Key: "route", Value: "login"}})
	left := func() uint64 {
		r, err := store.Grant(ctx, []limit.GrantOp{{Check: plan.Check}}) // takes nothing
		if err != nil {
			t.Fatal(err)
		}
		return r[0].Remaining
	}
	before := left()
	if resp, _ = ss.Report(ctx, now, u); actions(resp) != "deny/2s" {
		t.Errorf("grant 1.5 s before the window ends: %q, want deny until it ends (2 s: the first whole second past it)", actions(resp))
	}
	if after := left(); after != before {
		t.Errorf("the counter has %d left after a grant given back, %d before", after, before)
	}
	if got := testutil.ToFloat64(m.RLQSGrants.WithLabelValues("returned")); got != 1 {
		t.Errorf("returned grants = %v, want 1", got)
	}
	if w := ss.NextWake(); !w.Equal(t0.Add(time.Minute)) {
		t.Errorf("next wake %v, want the window's end", w)
	}
	now = t0.Add(time.Minute)
	if resp := ss.Wake(ctx, now); actions(resp) != "tokens/59s" {
		t.Errorf("wake at the new window: %q, want a fresh grant", actions(resp))
	}
}

// TestTokenBucketRule: a token_bucket rule's grants come from its bucket
// (at most its burst at once), last two report periods, and once it is
// empty the session wakes no sooner than a second later, not at the
// bucket's next hit.
func TestTokenBucketRule(t *testing.T) {
	now := t0
	store := memstore.New(memstore.Options{Now: func() time.Time { return now }})
	srv, m := unitServer(t, `domain: tb
rlqs: {descriptor_keys: [k]}
descriptors:
  - key: k
    rate_limit: {unit: second, requests_per_unit: 100, algorithm: token_bucket, burst: 20}
`, store, rlqs.Options{})
	ss, _ := srv.NewSession()
	defer ss.Close()
	ctx := context.Background()
	id := map[string]string{"k": "v"}
	resp, _ := ss.Report(ctx, now, report("tb", id))
	if got := actions(resp); got != "tokens/10s" {
		t.Fatalf("first grant %q, want a token bucket for 10s", got)
	}
	if n := resp.GetBucketAction()[0].GetQuotaAssignmentAction().GetRateLimitStrategy().GetTokenBucket().GetMaxTokens(); n != 20 {
		t.Errorf("grant of %d, want the burst, 20", n)
	}
	// The bucket drained: nothing to grant. The 20 requests reported may
	// all have come before the grant arrived (within the margin), so
	// the Envoy may hold its tokens still: no DENY_ALL over them.
	now = now.Add(5 * time.Millisecond)
	u := report("tb", id)
	u.BucketQuotaUsages[0].NumRequestsAllowed, u.BucketQuotaUsages[0].NumRequestsDenied = 20, 500
	resp, _ = ss.Report(ctx, now, u)
	if got := actions(resp); got != "" {
		t.Fatalf("empty bucket, the grant maybe held: %q, want no action", got)
	}
	if w := ss.NextWake(); w.Before(now.Add(time.Second)) {
		t.Errorf("wakes %v after, want a second at the soonest", w.Sub(now))
	}
	if got := testutil.ToFloat64(m.RLQSGrantHits.WithLabelValues("granted")); got != 20 {
		t.Errorf("granted hits %v, want 20", got)
	}
}

// TestBucketReportedTwice: a bucket twice in one report is granted once
// (two grants would send two buckets, the second dropping the first's
// tokens).
func TestBucketReportedTwice(t *testing.T) {
	now := t0.Add(10 * time.Second)
	srv, m := unitServer(t, kindsRules, memstore.New(memstore.Options{Now: func() time.Time { return now }}), rlqs.Options{})
	ss, _ := srv.NewSession()
	defer ss.Close()
	id := map[string]string{"tenant": "acme", "route": "login"}
	resp, _ := ss.Report(context.Background(), now, report("edge", id, map[string]string{"route": "login", "tenant": "acme"}))
	if got := actions(resp); got != "tokens/49s" {
		t.Errorf("a bucket reported twice: %q, want one grant", got)
	}
	if got := testutil.ToFloat64(m.RLQSGrants.WithLabelValues("taken")); got != 1 {
		t.Errorf("%v grants taken, want 1", got)
	}
}

// TestIdleNotGranted: a bucket whose report ends its idleness window
// without requests is abandoned, and no grant is taken for it.
func TestIdleNotGranted(t *testing.T) {
	now := t0.Add(time.Second)
	srv, m := unitServer(t, kindsRules, memstore.New(memstore.Options{Now: func() time.Time { return now }}), rlqs.Options{IdleAfter: 10 * time.Second})
	ss, _ := srv.NewSession()
	defer ss.Close()
	id := map[string]string{"tenant": "acme", "route": "login"}
	ctx := context.Background()
	if resp, _ := ss.Report(ctx, now, report("edge", id)); actions(resp) != "tokens/58s" {
		t.Fatalf("first grant %q", actions(resp))
	}
	idle := report("edge", id)
	idle.BucketQuotaUsages[0].NumRequestsAllowed = 0
	now = now.Add(58 * time.Second) // the grant expired, no requests since
	if resp, _ := ss.Report(ctx, now, idle); actions(resp) != "abandon" {
		t.Errorf("idle bucket: %q, want abandon alone", actions(resp))
	}
	if got := testutil.ToFloat64(m.RLQSGrants.WithLabelValues("taken")); got != 1 {
		t.Errorf("%v grants taken, want only the first", got)
	}
	if got := testutil.ToFloat64(m.RLQSBuckets); got != 0 {
		t.Errorf("buckets gauge %v after the only bucket was abandoned", got)
	}
}
