package rlqs_test

// How grants share a limit: by streams, by demand, held tokens, bucket
// ids and snapshots.

import (
	"context"
	"strings"
	"testing"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/ratelimitd/ratelimitd/config"
	"github.com/ratelimitd/ratelimitd/internal/memstore"
	"github.com/ratelimitd/ratelimitd/internal/rlqs"
	"github.com/ratelimitd/ratelimitd/internal/service"
)

// TestShareFollowsStreams: a bucket's share of what remains counts the
// buckets on its counter now: once the other stream is gone, one bucket
// may take all that remains; and the gauges return to zero.
func TestShareFollowsStreams(t *testing.T) {
	now := t0.Add(time.Second)
	srv, m := unitServer(t, kindsRules, memstore.New(memstore.Options{Now: func() time.Time { return now }}), rlqs.Options{})
	id := map[string]string{"tenant": "acme", "route": "login"}
	grant := func(ss *rlqs.Session, demand uint64) uint32 {
		t.Helper()
		return granted(counts(t, ss, now, "edge", id, 1, demand))
	}
	a, _ := srv.NewSession()
	b, _ := srv.NewSession()
	if got := grant(a, 0); got != 167 { // 1000 a minute: 10 s of it, over one bucket
		t.Fatalf("a's first grant %d, want 167", got)
	}
	if got := grant(b, 100_000); got != (1000-167)/2 {
		t.Fatalf("b's grant with a on the counter too: %d, want half of the %d left", got, 1000-167)
	}
	a.Close()
	c, _ := srv.NewSession()
	if got := grant(c, 100_000); got != (1000-167-416)/2 {
		t.Fatalf("c's grant with b on the counter: %d, want half of the %d left (a is gone)", got, 1000-167-416)
	}
	b.Close()
	c.Close()
	if s, bk := testutil.ToFloat64(m.RLQSStreams), testutil.ToFloat64(m.RLQSBuckets); s != 0 || bk != 0 {
		t.Errorf("gauges after every stream closed: %v streams, %v buckets", s, bk)
	}
}

// hourSession is a session of domain d, whose rule k is 3.6 million an
// hour, on a store reading *now.
func hourSession(t *testing.T, now *time.Time) (*rlqs.Session, *rlqs.Metrics) {
	t.Helper()
	srv, m := unitServer(t, `domain: d
rlqs: {descriptor_keys: [k]}
descriptors:
  - key: k
    rate_limit: {unit: hour, requests_per_unit: 3600000}
`, memstore.New(memstore.Options{Now: func() time.Time { return *now }}), rlqs.Options{})
	ss, _ := srv.NewSession()
	t.Cleanup(ss.Close)
	return ss, m
}

// TestGrantFollowsDemand: grants are the measured demand until the report
// after next (the first measurement taken as is, later ones averaged); a
// grant lasting to the next report is kept, and so is one not yet spent
// at its demand on a counter that runs out before its window ends (it is
// renewed when it is expected spent: see TestHeldTokensNotRevoked).
func TestGrantFollowsDemand(t *testing.T) {
	now := t0.Add(time.Second)
	ss, m := hourSession(t, &now)
	id := map[string]string{"k": "v"}
	step := func(allowed, denied uint64) *rlqsv3.RateLimitQuotaResponse {
		t.Helper()
		return counts(t, ss, now, "d", id, allowed, denied)
	}
	if got := granted(step(1, 0)); got != 10_000 { // unmeasured: 10 s of the rule's rate
		t.Fatalf("first grant %d, want 10000", got)
	}
	now = now.Add(5 * time.Second)
	if got := granted(step(10_000, 0)); got != 20_000 { // 2000/s measured
		t.Fatalf("grant at 2000/s: %d, want 20000", got)
	}
	now = now.Add(5 * time.Second)
	if resp := step(5_000, 0); resp != nil { // 15000 left: more than half a period at 1500/s
		t.Fatalf("a grant with plenty left was replaced: %v", actions(resp))
	}
	now = now.Add(5 * time.Second)
	if got := granted(step(15_000, 15_000)); got != 37_500 { // (1500/s + 6000/s) / 2 = 3750/s
		t.Fatalf("grant after averaging: %d, want 37500", got)
	}
	if got := testutil.ToFloat64(m.RLQSGrantHits.WithLabelValues("lost")); got != 0 {
		t.Fatalf("lost hits %v after grants spent whole", got)
	}
	now = now.Add(5 * time.Second)
	// 7500 left, under a period at (3750/s + 6000/s) / 2 = 4875/s; but at
	// that rate the hour's 3.6M run out in 12 minutes, so every token
	// counts: the grant is kept (replacing it would throw its 7500 away).
	if resp := step(30_000, 0); resp != nil {
		t.Fatalf("a grant holding 1.5 s of demand was replaced on a counter that runs out: %v", actions(resp))
	}
	now = now.Add(5 * time.Second)
	if got := granted(step(7_500, 20_000)); got != 51_875 { // spent: (4875/s + 5500/s) / 2
		t.Fatalf("grant at 5187.5/s: %d, want 51875", got)
	}
	if got := testutil.ToFloat64(m.RLQSGrantHits.WithLabelValues("lost")); got != 0 {
		t.Errorf("lost hits %v, want none: the replaced grant was spent", got)
	}
}

// TestReplacedGrantLostNeverNegative: a report may count more allowed
// requests than a grant held (those before it arrived came from the
// assignment before); the grant replaced then lost nothing, never
// "granted less used" wrapped around.
func TestReplacedGrantLostNeverNegative(t *testing.T) {
	now := t0.Add(10 * time.Second)
	ss, m := hourSession(t, &now)
	id := map[string]string{"k": "v"}
	if got := granted(counts(t, ss, now, "d", id, 1, 0)); got != 10_000 {
		t.Fatalf("first grant %d, want 10000", got)
	}
	now = now.Add(5 * time.Second)
	if got := granted(counts(t, ss, now, "d", id, 12_000, 0)); got == 0 {
		t.Fatal("no grant replacing the one reported spent")
	}
	if got := testutil.ToFloat64(m.RLQSGrantHits.WithLabelValues("lost")); got != 0 {
		t.Errorf("lost hits %v, want none: 12000 allowed were reported over a grant of 10000", got)
	}
}

// TestShareByDemand: what remains is shared by demand among the buckets
// on a counter (at least evenly): a bucket with 99 % of the demand may
// take 99 % of what remains.
func TestShareByDemand(t *testing.T) {
	now := t0.Add(time.Second)
	a, b := twoSessions(t, `domain: d
rlqs: {descriptor_keys: [k]}
descriptors:
  - key: k
    rate_limit: {unit: hour, requests_per_unit: 100000}
`, &now)
	id := map[string]string{"k": "v"}
	step := func(ss *rlqs.Session, allowed, denied uint64) uint32 {
		t.Helper()
		return granted(counts(t, ss, now, "d", id, allowed, denied))
	}
	ga := step(a, 1, 0) // 10 s of the rule's rate: 278
	gb := step(b, 1, 0) // the same over two buckets: 139
	if ga != 278 || gb != 139 {
		t.Fatalf("first grants %d, %d, want 278, 139", ga, gb)
	}
	now = now.Add(5 * time.Second)
	if got := step(b, 139, 361); got != 1000 { // 100/s
		t.Fatalf("b at 100/s: %d, want 1000", got)
	}
	remaining := uint64(100_000 - 278 - 139 - 1000)
	want := uint32(float64(remaining) * min(1.0, 10000.0/10100.0))
	if got := step(a, 278, 49_722); got != want { // 10000/s: 99 % of the demand
		t.Errorf("a at 10000/s: %d, want %d (its share of the demand of what remains, not half)", got, want)
	}
}

// TestBucketIDBounds: ids are refused one pair or one byte past the bound,
// not at it.
func TestBucketIDBounds(t *testing.T) {
	srv, m := unitServer(t, kindsRules, nil, rlqs.Options{MaxBucketIDBytes: 64})
	ss, _ := srv.NewSession()
	defer ss.Close()
	pairs := func(n int) map[string]string {
		id := map[string]string{}
		for i := range n { // one-byte keys: the pairs bound, not the bytes, decides
			id[string(rune('A'+i))] = ""
		}
		return id
	}
	for _, tt := range []struct {
		id   map[string]string
		want int
	}{
		{map[string]string{"tenant": strings.Repeat("x", 58)}, 1}, // 64 bytes
		{map[string]string{"tenant": strings.Repeat("x", 59)}, 0},
		{pairs(rlqs.MaxBucketIDEntries), 1},
		{pairs(rlqs.MaxBucketIDEntries + 1), 0},
	} {
		resp, _ := ss.Report(context.Background(), t0, report("edge", tt.id))
		if got := len(resp.GetBucketAction()); got != tt.want {
			t.Errorf("id of %d pairs: %d actions, want %d", len(tt.id), got, tt.want)
		}
	}
	if got := testutil.ToFloat64(m.RLQSRejected.WithLabelValues("bucket_id_too_large")); got != 2 {
		t.Errorf("refused ids %v, want 2", got)
	}
}

// TestShareSteady: steady demands keep their shares report after report.
// Each bucket's measured rate is its part of its counter's demand, put in
// once and replaced at every report, never added again (which would grow
// the sum with every report and shrink every share to the even one).
func TestShareSteady(t *testing.T) {
	now := t0.Add(time.Second)
	a, b := twoSessions(t, `domain: d
rlqs: {descriptor_keys: [k]}
descriptors:
  - key: k
    rate_limit: {unit: minute, requests_per_unit: 60000}
`, &now)
	id := map[string]string{"k": "v"}
	counts(t, a, now, "d", id, 1, 0)
	counts(t, b, now, "d", id, 1, 0)
	for cycle := range 6 {
		// A new window each cycle: a at 10,000/s, b at 100/s, a first,
		// so it asks for its share of the whole window.
		now = now.Add(time.Minute)
		ga := granted(counts(t, a, now, "d", id, 60_000, 540_000))
		counts(t, b, now, "d", id, 6_000, 0)
		if cycle > 0 && ga < 59_000 {
			t.Fatalf("cycle %d: a's grant %d, want its 99 %% share of the window's 60000", cycle, ga)
		}
	}
}

// TestGrantTTLByAlgorithm: a window's grant lives to its window's end
// (less the margin), a sliding window's as a fixed one's; a token bucket
// rule's, which has no window end, for two report periods.
func TestGrantTTLByAlgorithm(t *testing.T) {
	now := t0.Add(10 * time.Second)
	srv, _ := unitServer(t, `domain: algos
rlqs: {descriptor_keys: [k]}
descriptors:
  - key: k
    value: fixed
    rate_limit: {unit: minute, requests_per_unit: 1000}
  - key: k
    value: sliding
    rate_limit: {unit: minute, requests_per_unit: 1000, algorithm: sliding_window}
  - key: k
    value: bucket
    rate_limit: {unit: minute, requests_per_unit: 1000, algorithm: token_bucket}
`, memstore.New(memstore.Options{Now: func() time.Time { return now }}), rlqs.Options{})
	ss, _ := srv.NewSession()
	defer ss.Close()
	for _, tt := range []struct{ value, want string }{
		{"fixed", "tokens/49s"}, {"sliding", "tokens/49s"}, {"bucket", "tokens/10s"},
	} {
		resp, err := ss.Report(context.Background(), now, report("algos", map[string]string{"k": tt.value}))
		if err != nil {
			t.Fatal(err)
		}
		if got := actions(resp); got != tt.want {
			t.Errorf("%s: %q, want %q", tt.value, got, tt.want)
		}
	}
}

// TestHeldTokensNotRevoked: when a bucket runs short and nothing is left
// to grant, the tokens the Envoy still holds (charged to the counter
// already) are left to run out on their TTL, not wiped by a DENY_ALL;
// the next window's grant is pushed at its start. A bucket that holds
// nothing is denied until then.
func TestHeldTokensNotRevoked(t *testing.T) {
	now := t0.Add(time.Second)
	a, b := twoSessions(t, kindsRules, &now)
	id := map[string]string{"tenant": "acme", "route": "login"} // 1000 a minute
	if got := granted(counts(t, a, now, "edge", id, 1, 0)); got != 167 {
		t.Fatalf("a's first grant %d, want 167", got)
	}
	if got := granted(counts(t, b, now, "edge", id, 1, 100_000)); got != 416 {
		t.Fatalf("b's first grant %d, want 416", got)
	}
	now = now.Add(5 * time.Second)
	bGranted := now
	if got := granted(counts(t, b, now, "edge", id, 416, 500_000)); got != 417 {
		t.Fatalf("b's second grant %d, want the 417 left", got)
	}
	// a has used 150 of its 167 and runs short; nothing is left.
	resp := counts(t, a, now, "edge", id, 150, 0)
	if got := actions(resp); got != "" {
		t.Fatalf("a running short with 17 tokens held: %q, want no action (its tokens run out on their TTL)", got)
	}
	// a is woken when its 17 tokens are spent at its demand (30 a
	// second), to renew the grant: nothing to grant, tokens held, so no
	// action still, and the next wake is the window's end.
	if w := a.NextWake(); !w.After(now) || w.After(now.Add(time.Second)) {
		t.Fatalf("a's next wake %v, want when its tokens are spent, within a second of %v", w, now)
	}
	now = a.NextWake().Truncate(time.Millisecond).Add(time.Millisecond) // the store's clock too, in its µs
	if resp := a.Wake(context.Background(), now); resp != nil {
		t.Fatalf("a woken with its tokens spent and nothing left: %q, want no action", actions(resp))
	}
	if want := t0.Add(time.Minute); !a.NextWake().Equal(want) {
		t.Errorf("a's next wake %v, want the window's end %v", a.NextWake(), want)
	}
	// b reports, nothing spent yet, once its grant surely arrived and
	// the report surely was made after (a margin each), then its tokens
	// spent: it holds nothing, and is denied. (Requests reported over
	// the grant's arrival may have come before it: they would not show
	// it spent.)
	now = bGranted.Add(2 * rlqs.DefaultMargin)
	if got := actions(counts(t, b, now, "edge", id, 0, 0)); got != "" {
		t.Fatalf("b holding its grant: %q, want no action", got)
	}
	if got := actions(counts(t, b, now.Add(500*time.Millisecond), "edge", id, 417, 0)); !strings.HasPrefix(got, "deny/") {
		t.Errorf("b with nothing held: %q, want a DENY_ALL until the window ends", got)
	}
}

// elapsed reports one usage of id on ss at now, as a periodic report
// (time_elapsed 5 s) of a bucket the Envoy knew before: the first report
// of a bucket new to it has none.
func elapsed(t *testing.T, ss *rlqs.Session, now time.Time, id map[string]string, allowed, denied uint64) *rlqsv3.RateLimitQuotaResponse {
	t.Helper()
	r := report("edge", id)
	u := r.BucketQuotaUsages[0]
	u.NumRequestsAllowed, u.NumRequestsDenied, u.TimeElapsed = allowed, denied, durationpb.New(rlqs.ReportPeriod)
	resp, err := ss.Report(context.Background(), now, r)
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

// TestForeignBucket: a bucket a stream first hears of in a periodic
// report (failover, restart, reconnect) may hold a token bucket another
// instance granted, or run on ALLOW_ALL, or on a grant about to run dry:
// it is assigned at that first report, a DENY_ALL and then its grant
// (a token bucket sent over the old one would be scaled by its fill), so
// that it holds exactly the grant within a report period of losing its
// stream, whether or not it refuses requests yet.
func TestForeignBucket(t *testing.T) {
	now := t0.Add(time.Second)
	a, b := twoSessions(t, kindsRules, &now)
	id := map[string]string{"tenant": "acme", "route": "login"} // 1000 a minute
	resp := elapsed(t, a, now, id, 50, 0)
	if got := actions(resp); !strings.HasPrefix(got, "deny/") || !strings.Contains(got, " tokens/") {
		t.Fatalf("a foreign bucket refusing nothing: %q, want a DENY_ALL then a token bucket", got)
	}
	// Its demand is measured from its first report (50 in 5 s): 10 a
	// second, to the report after its next one.
	if got := granted(resp); got != 100 {
		t.Errorf("a foreign bucket's grant %d, want 100", got)
	}
	// Its next grant replaces one this stream sent: the usual way.
	if got := actions(elapsed(t, a, now.Add(5*time.Second), id, 50, 0)); got != "" {
		t.Fatalf("a grant of this stream with plenty left: %q, want it kept", got)
	}
	if got := actions(elapsed(t, b, now, id, 10, 3)); !strings.HasPrefix(got, "deny/") || !strings.Contains(got, " tokens/") {
		t.Fatalf("a foreign bucket refusing requests: %q, want a DENY_ALL then a token bucket", got)
	}

	// A bucket new to the Envoy (no time elapsed) is granted at once,
	// without a DENY_ALL: it holds nothing.
	fresh := map[string]string{"tenant": "beta"} // 100 an hour
	if got := actions(counts(t, a, now, "edge", fresh, 1, 0)); !strings.HasPrefix(got, "tokens/") {
		t.Fatalf("a bucket new to the Envoy: %q, want a token bucket alone", got)
	}
}

// TestDenyOnceHeldTokensGone: a bucket that may still hold tokens when
// nothing is left to grant (its grant reported spent only over the
// report spanning its arrival, which may count requests from before it)
// is denied once the grant's assignment has surely ended at the Envoy:
// its TTL counted from a margin after it was sent. Under Envoy's
// permissive defaults an expired assignment admits everything until the
// next one. That DENY_ALL wakes the session at the window's end, not a
// second after (its TTL is whole seconds).
func TestDenyOnceHeldTokensGone(t *testing.T) {
	now := t0.Add(1500 * time.Millisecond)
	a, b := twoSessions(t, kindsRules, &now)
	id := map[string]string{"tenant": "acme", "route": "login"} // 1000 a minute
	ga := granted(counts(t, a, now, "edge", id, 1, 0))
	gb := granted(counts(t, b, now, "edge", id, 1, 100_000))
	if ga == 0 || gb == 0 {
		t.Fatalf("first grants %d and %d", ga, gb)
	}
	now = now.Add(5 * time.Second)
	if got := granted(counts(t, b, now, "edge", id, uint64(gb), 500_000)); got == 0 {
		t.Fatal("b's second grant: none")
	}
	// a reports its grant's worth, over the report spanning its arrival.
	if got := actions(counts(t, a, now, "edge", id, uint64(ga), 0)); got != "" {
		t.Fatalf("a maybe holding tokens, nothing left: %q, want no action", got)
	}
	// Its assignment (58.5 s to the window's end, less the margin, in
	// whole seconds: 57 s) ends at the Envoy by 58.5 s + the margin.
	heldTill := t0.Add(59500 * time.Millisecond)
	if w := a.NextWake(); !w.Equal(heldTill) {
		t.Fatalf("a's next wake %v, want %v", w.Sub(t0), heldTill.Sub(t0))
	}
	now = heldTill
	if got := actions(a.Wake(context.Background(), now)); got != "deny/1s" {
		t.Fatalf("a woken once its assignment surely ended: %q, want deny/1s", got)
	}
	if w := a.NextWake(); !w.Equal(t0.Add(time.Minute)) {
		t.Errorf("a's next wake %v, want the window's end", w.Sub(t0))
	}
}

// TestNoDenyOverHeldTokensAtWindowEnd: a grant asked for too near the
// window's end to hand out is given back; a bucket that still holds
// tokens is then left to spend them (a DENY_ALL would throw them away),
// one that holds none is denied until the next window.
func TestNoDenyOverHeldTokensAtWindowEnd(t *testing.T) {
	now := t0.Add(time.Second)
	a, _ := twoSessions(t, kindsRules, &now)
	id := map[string]string{"tenant": "acme", "route": "login"} // 1000 a minute
	if got := granted(counts(t, a, now, "edge", id, 1, 0)); got == 0 {
		t.Fatal("no first grant")
	}
	// 7 of the 167 left at 1.5 s before the window ends, spending 180 a
	// second: asked for too late to hand out (under the margin and a
	// second), the grant is given back.
	now = t0.Add(time.Minute - 1500*time.Millisecond)
	if got := actions(counts(t, a, now, "edge", id, 160, 10_000)); got != "" {
		t.Fatalf("a bucket running short near the window's end, tokens held: %q, want no action", got)
	}
	// Its 7 spent and requests refused: its token bucket is empty.
	if got := actions(counts(t, a, now.Add(100*time.Millisecond), "edge", id, 7, 100)); !strings.HasPrefix(got, "deny/") {
		t.Fatalf("the same bucket with nothing held: %q, want a DENY_ALL to the window's end", got)
	}
}

// reloading is a planner whose rules are replaced right after a report
// reads them, as a reload racing the report would.
type reloading struct {
	*service.Service
	next *config.Snapshot
}

func (r *reloading) Rules() *config.Snapshot {
	cur := r.Service.Rules()
	if r.next != nil {
		r.Service.SetRules(r.next)
		r.next = nil
	}
	return cur
}

// TestOneSnapshotPerReport: a report reads the rules once; the domain's
// rlqs keys and the buckets' rules come from the same snapshot, so a
// reload between them cannot pair one set's keys with another's rules.
func TestOneSnapshotPerReport(t *testing.T) {
	parse := func(body string) *config.Snapshot {
		snap, err := config.Parse("rules.yaml", []byte(body))
		if err != nil {
			t.Fatal(err)
		}
		return snap
	}
	before := parse("domain: edge\nrlqs: {descriptor_keys: [tenant]}\ndescriptors:\n  - key: tenant\n    rate_limit: {unit: minute, requests_per_unit: 1000}\n")
	after := parse("domain: edge\nrlqs: {descriptor_keys: [route]}\ndescriptors:\n  - key: route\n    rate_limit: {unit: minute, requests_per_unit: 1000}\n")
	// The store on the report's clock: on the machine's, a report made in
	// a minute's last second was answered by the window's end (DENY_ALL).
	store := memstore.New(memstore.Options{Now: func() time.Time { return t0 }})
	svc := service.New(before, store, nil, service.Options{})
	srv := rlqs.New(&reloading{svc, after}, store, rlqs.Options{})
	ss, _ := srv.NewSession()
	defer ss.Close()
	// Before's keys and rules: (tenant, acme), limited. Before's keys with
	// after's rules would find no rule for it and allow all.
	resp := counts(t, ss, t0, "edge", map[string]string{"tenant": "acme", "route": "checkout"}, 1, 0)
	if got := actions(resp); !strings.HasPrefix(got, "tokens/") {
		t.Errorf("a report with a reload racing it: %q, want a grant under the rules it read", got)
	}
}
