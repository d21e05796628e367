package xds

import (
	"context"
	"log/slog"
	"net"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	rlsconf "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/ratelimitd/ratelimitd/config"
	"github.com/ratelimitd/ratelimitd/internal/xds/xdstest"
)

// loaded is what OnLoad received.
type loaded struct {
	snap *config.Snapshot
	err  error
}

// run starts Run against addr and returns what it loads; it stops at the
// test's end.
func run(t *testing.T, addr string) <-chan loaded {
	t.Helper()
	out := make(chan loaded, 16)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() {
		err := Run(ctx, Options{Server: addr, NodeID: "node-a", NodeMetadata: map[string]string{"zone": "z1"},
			BackoffInitial: 20 * time.Millisecond, BackoffMax: 100 * time.Millisecond,
			OnLoad: func(s *config.Snapshot, err error) { out <- loaded{s, err} }})
		if err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	t.Cleanup(func() { cancel(); wg.Wait() })
	return out
}

func next(t *testing.T, ch <-chan loaded) loaded {
	t.Helper()
	select {
	case l := <-ch:
		return l
	case <-time.After(20 * time.Second):
		t.Fatal("nothing loaded within 20 s")
		return loaded{}
	}
}

// limitOf is the limit the rules give domain's key=value.
func limitOf(t *testing.T, s *config.Snapshot, domain, key, value string) uint64 {
	t.Helper()
	d := s.Domain(domain)
	if d == nil {
		t.Fatalf("no domain %q in %v", domain, s.Domains())
	}
	r := d.Match([]*rlcommon.RateLimitDescriptor_Entry{{Key: key, Value: value}})
	if r == nil || r.Limit == nil {
		t.Fatalf("no limit for %s=%s in %s", key, value, domain)
	}
	return r.Limit.RequestsPerUnit
}

func acked(version string) func(*discovery.DiscoveryRequest) bool {
	return func(r *discovery.DiscoveryRequest) bool {
		return r.GetVersionInfo() == version && r.GetErrorDetail() == nil && r.GetResponseNonce() != ""
	}
}

// TestStream: a real go-control-plane management server delivers the
// first set, an update, an invalid update (NACKed with the error, the
// rules in force kept: nothing is handed over) and, after the server
// restarts with a new set, that set.
func TestStream(t *testing.T) {
	var streams atomic.Int64
	srv := xdstest.Start(t, "127.0.0.1:0", grpc.StreamInterceptor(func(x any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, h grpc.StreamHandler) error {
		streams.Add(1)
		return h(x, ss)
	}))
	srv.Set("node-a", "1", xdstest.Limit("api", "api", "path", "/a", 5), xdstest.Limit("web", "web", "host", "", 50))
	ch := run(t, srv.Addr)

	l := next(t, ch)
	if l.err != nil {
		t.Fatalf("initial set: %v", l.err)
	}
	if got := limitOf(t, l.snap, "api", "path", "/a"); got != 5 {
		t.Fatalf("initial limit %d, want 5", got)
	}
	if got := limitOf(t, l.snap, "web", "host", "anything"); got != 50 {
		t.Fatalf("initial web limit %d, want 50", got)
	}
	if srv.WaitFor(10*time.Second, acked("1")) == nil {
		t.Fatal("version 1 not ACKed")
	}
	first := srv.Requests()[0]
	if first.GetNode().GetId() != "node-a" || first.GetNode().GetMetadata().GetFields()["zone"].GetStringValue() != "z1" {
		t.Errorf("node sent: %v", first.GetNode())
	}

	srv.Set("node-a", "2", xdstest.Limit("api", "api", "path", "/a", 7))
	l = next(t, ch)
	if l.err != nil {
		t.Fatalf("update: %v", l.err)
	}
	if got := limitOf(t, l.snap, "api", "path", "/a"); got != 7 || l.snap.Domain("web") != nil {
		t.Fatalf("update: limit %d, domains %v; want 7, [api]", got, l.snap.Domains())
	}
	if srv.WaitFor(10*time.Second, acked("2")) == nil {
		t.Fatal("version 2 not ACKed")
	}

	// Invalid: an empty key in one resource of two.
	srv.Set("node-a", "3", xdstest.Limit("api", "api", "", "", 1), xdstest.Limit("web", "web", "host", "", 1))
	l = next(t, ch)
	if l.err == nil || l.snap != nil {
		t.Fatalf("invalid set loaded: %v", l)
	}
	if want := "api: descriptors[0].key: missing or empty key"; l.err.Error() != want {
		t.Errorf("error %q, want %q", l.err, want)
	}
	nack := srv.WaitFor(10*time.Second, func(r *discovery.DiscoveryRequest) bool { return r.GetErrorDetail() != nil })
	if nack == nil {
		t.Fatal("invalid set not NACKed")
	}
	if nack.GetVersionInfo() != "2" || nack.GetErrorDetail().GetMessage() != l.err.Error() {
		t.Errorf("NACK version %q message %q; want version 2 and %q", nack.GetVersionInfo(), nack.GetErrorDetail().GetMessage(), l.err)
	}

	// The cache answers each NACK by sending the set again: it is
	// refused again, not reported again, and not in a tight loop.
	time.Sleep(1500 * time.Millisecond)
	nacks := 0
	for _, r := range srv.Requests() {
		if r.GetErrorDetail() != nil {
			nacks++
		}
	}
	if nacks < 2 || nacks > 6 {
		t.Errorf("%d NACKs of the same set in 1.5 s; want it refused again, with pauses (2 to 6)", nacks)
	}
	select {
	case l := <-ch:
		t.Errorf("the same invalid set reported again: %v", l.err)
	default:
	}

	// One stream carried all of it: ACKs and NACKs keep the stream open.
	if n := streams.Load(); n != 1 {
		t.Errorf("%d streams opened before the restart, want 1", n)
	}

	// The server restarts on the same address with a new set.
	addr := srv.Addr
	srv.Stop()
	srv = xdstest.Start(t, addr)
	srv.Set("node-a", "4", xdstest.Limit("api", "api", "path", "/a", 9))
	l = next(t, ch)
	if l.err != nil {
		t.Fatalf("after restart: %v", l.err)
	}
	if got := limitOf(t, l.snap, "api", "path", "/a"); got != 9 {
		t.Fatalf("after restart: limit %d, want 9", got)
	}
	if srv.WaitFor(10*time.Second, acked("4")) == nil {
		t.Fatal("version 4 not ACKed after the restart")
	}
	select {
	case l := <-ch:
		t.Errorf("loaded again without a change: %v", l)
	case <-time.After(200 * time.Millisecond):
	}
}

// TestRenderMatchesFile: a RateLimitConfig compiles to the rules its
// equivalent file does (nesting, replaces, unlimited, shadow, detailed
// metric, and a policy named global/... global), and its problems are
// the file's, without lines.
func TestRenderMatchesFile(t *testing.T) {
	rc := &rlsconf.RateLimitConfig{Name: "edge", Domain: "edge", Descriptors: []*rlsconf.RateLimitDescriptor{
		{Key: "k1", Value: "v1", RateLimit: &rlsconf.RateLimitPolicy{Unit: rlsconf.RateLimitUnit_MINUTE, RequestsPerUnit: 5, Name: "per-k1"},
			Descriptors: []*rlsconf.RateLimitDescriptor{{Key: "sub", RateLimit: &rlsconf.RateLimitPolicy{Unit: rlsconf.RateLimitUnit_SECOND, RequestsPerUnit: 10}}}},
		{Key: "unl", RateLimit: &rlsconf.RateLimitPolicy{Unlimited: true, Replaces: []*rlsconf.RateLimitReplace{{Name: "per-k1"}}}},
		{Key: "zero", ShadowMode: true, DetailedMetric: true, RateLimit: &rlsconf.RateLimitPolicy{Unit: rlsconf.RateLimitUnit_DAY}},
		{Key: "p", Value: "/api/*", RateLimit: &rlsconf.RateLimitPolicy{Unit: rlsconf.RateLimitUnit_HOUR, RequestsPerUnit: 3}},
		{Key: "whitelist", Value: "123"},
		{Key: "tenant", RateLimit: &rlsconf.RateLimitPolicy{Unit: rlsconf.RateLimitUnit_MINUTE, RequestsPerUnit: 600, Name: "global/tenant-cap"}},
	}}
	file := `domain: edge
descriptors:
  - key: k1
    value: v1
    rate_limit: {unit: minute, requests_per_unit: 5, name: per-k1}
    descriptors:
      - key: sub
        rate_limit: {unit: second, requests_per_unit: 10}
  - key: unl
    rate_limit: {unlimited: true, replaces: [{name: per-k1}]}
  - key: zero
    shadow_mode: true
    detailed_metric: true
    rate_limit: {unit: day, requests_per_unit: 0}
  - key: p
    value: "/api/*"
    rate_limit: {unit: hour, requests_per_unit: 3}
  - key: whitelist
    value: "123"
  - key: tenant
    rate_limit: {unit: minute, requests_per_unit: 600, name: global/tenant-cap, global: true}
`
	a, err := anypb.New(rc)
	if err != nil {
		t.Fatal(err)
	}
	got, err := Load(context.Background(), config.Options{}, []*anypb.Any{a})
	if err != nil {
		t.Fatal(err)
	}
	want, err := config.Parse("edge", []byte(file))
	if err != nil {
		t.Fatal(err)
	}
	type ruleOf struct {
		Path, Key, Value           string
		Limit                      *config.RateLimit
		ShadowMode, DetailedMetric bool
	}
	rulesOf := func(s *config.Snapshot) (out []ruleOf) {
		for _, r := range s.Domain("edge").Rules() {
			out = append(out, ruleOf{r.Path, r.Key, r.Value, r.Limit, r.ShadowMode, r.DetailedMetric})
		}
		return out
	}
	if g, w := rulesOf(got), rulesOf(want); !reflect.DeepEqual(g, w) || len(g) != 7 {
		t.Errorf("rendered rules:\n%+v\nfile's:\n%+v", g, w)
	}
	for _, r := range got.Domain("edge").Rules() {
		if r.File != "edge" || r.Line != 0 {
			t.Errorf("rule %s at %s:%d; want the resource's name and no line", r.Path, r.File, r.Line)
		}
	}

	// Each problem a file would have, named by path without a line.
	rc.Descriptors[0].RateLimit.Unit = rlsconf.RateLimitUnit_UNKNOWN
	rc.Descriptors[1].RateLimit.Unit = rlsconf.RateLimitUnit_SECOND
	rc.Descriptors = append(rc.Descriptors, &rlsconf.RateLimitDescriptor{Key: "k1", Value: "v1"})
	a, _ = anypb.New(rc)
	_, err = Load(context.Background(), config.Options{}, []*anypb.Any{a})
	for _, want := range []string{
		"edge: descriptors[0].rate_limit.unit: unknown unit \"unknown\"",
		"edge: descriptors[1].rate_limit.unit: unlimited: true must not have a unit",
		"edge: descriptors[6]",
	} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error %v lacks %q", err, want)
		}
	}

	// Two resources of one domain, as two files would be.
	web1, _ := anypb.New(xdstest.Limit("web-1", "web", "a", "", 1))
	web2, _ := anypb.New(xdstest.Limit("web-2", "web", "b", "", 1))
	if _, err := Load(context.Background(), config.Options{}, []*anypb.Any{web1, web2}); err == nil || !strings.Contains(err.Error(), `web-2: duplicate domain "web" (already defined in web-1`) {
		t.Errorf("duplicate domain: %v", err)
	}
	if s, err := Load(context.Background(), config.Options{MergeDomains: true}, []*anypb.Any{web1, web2}); err != nil || len(s.Domain("web").Rules()) != 2 {
		t.Errorf("merged: %v", err)
	}

	// A resource of another type is refused, naming it.
	other, _ := anypb.New(&rlsconf.RateLimitPolicy{})
	if _, err := Load(context.Background(), config.Options{}, []*anypb.Any{other}); err == nil || !strings.Contains(err.Error(), "resource 0 (type.googleapis.com/ratelimit.config.ratelimit.v3.RateLimitPolicy)") {
		t.Errorf("wrong type: %v", err)
	}
}

// TestUnits serves, through go-control-plane's own server, a set with
// every unit of the current RateLimitConfig proto: WEEK, MONTH and YEAR
// (7, 5 and 6) are beyond the v0.1.0 generated type ratelimitd builds
// with, and one such policy once had every set NACKed. quota_mode (field
// 7 of the current proto, unknown to v0.1.0) survives too. A unit no
// proto defines refuses the set, naming the rule.
func TestUnits(t *testing.T) {
	units := map[string]rlsconf.RateLimitUnit{"second": 1, "minute": 2, "hour": 3, "day": 4, "month": 5, "year": 6, "week": 7}
	rc := &rlsconf.RateLimitConfig{Name: "all", Domain: "all"}
	for name, u := range units {
		rc.Descriptors = append(rc.Descriptors, &rlsconf.RateLimitDescriptor{Key: "u", Value: name,
			RateLimit: &rlsconf.RateLimitPolicy{Unit: u, RequestsPerUnit: 9}})
	}
	quota := &rlsconf.RateLimitDescriptor{Key: "q", RateLimit: &rlsconf.RateLimitPolicy{Unit: 5, RequestsPerUnit: 1000}}
	quota.ProtoReflect().SetUnknown(protowire.AppendVarint(protowire.AppendTag(nil, 7, protowire.VarintType), 1))
	rc.Descriptors = append(rc.Descriptors, quota)

	srv := xdstest.Start(t, "127.0.0.1:0")
	srv.Set("node-a", "1", rc)
	ch := run(t, srv.Addr)
	l := next(t, ch)
	if l.err != nil {
		t.Fatalf("set with every unit refused: %v", l.err)
	}
	if srv.WaitFor(10*time.Second, acked("1")) == nil {
		t.Fatal("version 1 not ACKed")
	}
	for _, r := range l.snap.Domain("all").Rules() {
		switch {
		case r.Key == "q":
			if !r.QuotaMode || r.Limit.Unit != config.UnitMonth {
				t.Errorf("quota rule: quota_mode %v unit %v; want true, month", r.QuotaMode, r.Limit.Unit)
			}
		case r.Limit.Unit != config.Unit(units[r.Value]) || r.Limit.Unit.String() != r.Value || r.Limit.RequestsPerUnit != 9:
			t.Errorf("rule %s: unit %v (%d/unit); want %s", r.Path, r.Limit.Unit, r.Limit.RequestsPerUnit, r.Value)
		}
	}

	bad := &rlsconf.RateLimitConfig{Name: "bad", Domain: "gw", Descriptors: []*rlsconf.RateLimitDescriptor{
		{Key: "route", Value: "r1", Descriptors: []*rlsconf.RateLimitDescriptor{
			{Key: "ip", RateLimit: &rlsconf.RateLimitPolicy{Unit: 42, RequestsPerUnit: 1}}}}}}
	srv.Set("node-a", "2", rc, bad)
	l = next(t, ch)
	want := "bad: descriptors[0].descriptors[0] (rule gw.route_r1.ip): rate_limit.unit 42 is no unit of RateLimitConfig"
	if l.err == nil || !strings.Contains(l.err.Error(), want) {
		t.Fatalf("unit 42: %v; want an error containing %q", l.err, want)
	}
	nack := srv.WaitFor(10*time.Second, func(r *discovery.DiscoveryRequest) bool { return r.GetErrorDetail() != nil })
	if nack == nil || nack.GetVersionInfo() != "1" || !strings.Contains(nack.GetErrorDetail().GetMessage(), "rule gw.route_r1.ip") {
		t.Fatalf("NACK %v; want version 1 kept and the rule named", nack)
	}
}

// TestSetSumIgnoresOrder: a set is recognised as the one last refused
// whatever order its resources come in (go-control-plane sends a
// snapshot's in map order), and a different set is not.
func TestSetSumIgnoresOrder(t *testing.T) {
	var rs []*anypb.Any
	for _, n := range []string{"a", "b", "c", "d"} {
		a, err := anypb.New(xdstest.Limit(n, n, "k", "", 1))
		if err != nil {
			t.Fatal(err)
		}
		rs = append(rs, a)
	}
	want := setSum(rs)
	for _, order := range [][]int{{3, 2, 1, 0}, {1, 0, 3, 2}, {2, 3, 0, 1}} {
		shuffled := make([]*anypb.Any, len(rs))
		for i, j := range order {
			shuffled[i] = rs[j]
		}
		if setSum(shuffled) != want {
			t.Errorf("order %v: another sum", order)
		}
	}
	if setSum(rs[:3]) == want || setSum(append(rs[:3:3], rs[0])) == want {
		t.Error("a different set has the same sum")
	}
}

// TestBackoffGrows: while the management server cannot be reached, the
// waits between attempts double up to the maximum: in 1.5 s with waits
// starting at 20 ms, a handful of attempts, not one every 20 ms.
func TestBackoffGrows(t *testing.T) {
	// Doubling from 20 ms (each wait jittered within its second half):
	// at most 8 attempts fit in 1.5 s; a wait that never grew, 75 or so.
	if n := attempts(t, Options{BackoffInitial: 20 * time.Millisecond, BackoffMax: 5 * time.Second}, 1500*time.Millisecond); n < 2 || n > 9 {
		t.Errorf("%d attempts in 1.5 s, want 2 to 9 (doubling waits)", n)
	}
}

// countHandler counts the log records whose message starts with prefix.
type countHandler struct {
	n      *atomic.Int64
	prefix string
}

func (h countHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h countHandler) Handle(_ context.Context, r slog.Record) error {
	if strings.HasPrefix(r.Message, h.prefix) {
		h.n.Add(1)
	}
	return nil
}
func (h countHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h countHandler) WithGroup(string) slog.Handler      { return h }

// attempts runs Run against an address nothing listens on for d and
// counts the streams that ended.
func attempts(t *testing.T, o Options, d time.Duration) int64 {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	o.Server = lis.Addr().String()
	lis.Close()
	var n atomic.Int64
	o.Logger = slog.New(countHandler{&n, "xds: stream to the management server ended"})
	o.OnLoad = func(*config.Snapshot, error) {}
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	if err := Run(ctx, o); err != nil {
		t.Fatal(err)
	}
	return n.Load()
}

// TestBackoffBounds: without backoff options the defaults apply (a
// second first: one or two attempts in half a second, not a tight loop),
// and the waits stop growing at BackoffMax.
func TestBackoffBounds(t *testing.T) {
	if n := attempts(t, Options{}, 500*time.Millisecond); n > 2 {
		t.Errorf("%d attempts in 0.5 s with the default backoff (1 s first), want at most 2", n)
	}
	// 10 ms doubling to at most 20 ms: dozens in 1.5 s; growing past the
	// maximum, under ten.
	if n := attempts(t, Options{BackoffInitial: 10 * time.Millisecond, BackoffMax: 20 * time.Millisecond}, 1500*time.Millisecond); n < 15 {
		t.Errorf("%d attempts in 1.5 s with waits of at most 20 ms, want 15 or more", n)
	}
	// A maximum equal to the first wait is kept: the waits never grow.
	if n := attempts(t, Options{BackoffInitial: 20 * time.Millisecond, BackoffMax: 20 * time.Millisecond}, 1500*time.Millisecond); n < 15 {
		t.Errorf("%d attempts in 1.5 s with waits of 20 ms, want 15 or more", n)
	}
}

// TestHeadersSent: Headers go to the management server as gRPC metadata
// when the stream opens (a token, say).
func TestHeadersSent(t *testing.T) {
	var mu sync.Mutex
	var got metadata.MD
	srv := xdstest.Start(t, "127.0.0.1:0", grpc.StreamInterceptor(func(s any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, h grpc.StreamHandler) error {
		md, _ := metadata.FromIncomingContext(ss.Context())
		mu.Lock()
		got = md
		mu.Unlock()
		return h(s, ss)
	}))
	srv.Set("node-h", "1", xdstest.Limit("api", "api", "k", "", 5))
	out := make(chan loaded, 4)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() {
		_ = Run(ctx, Options{Server: srv.Addr, NodeID: "node-h", Headers: map[string]string{"authorization": "Bearer t0k"},
			OnLoad: func(s *config.Snapshot, err error) { out <- loaded{s, err} }})
	})
	defer func() { cancel(); wg.Wait() }()
	if l := next(t, out); l.err != nil {
		t.Fatal(l.err)
	}
	mu.Lock()
	defer mu.Unlock()
	if v := got.Get("authorization"); len(v) != 1 || v[0] != "Bearer t0k" {
		t.Errorf("metadata at the server: %v", got)
	}
}
