package incumbentstats

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	"go.uber.org/goleak"

	"github.com/ratelimitd/ratelimitd/config"
)

// TestMain fails the package's tests if any goroutine outlives them, but
// for gostats' connecting goroutine, which it gives no way to end.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreAnyFunction("github.com/lyft/gostats.(*netSink).run"))
}

func entries(kv ...string) []*rlcommon.RateLimitDescriptor_Entry {
	var out []*rlcommon.RateLimitDescriptor_Entry
	for i := 0; i+1 < len(kv); i += 2 {
		out = append(out, &rlcommon.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	return out
}

// TestPaths: the key path of each way the incumbent names a rule's stats.
func TestPaths(t *testing.T) {
	snap, err := config.Parse("t", []byte(`domain: d
descriptors:
  - key: plain
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: path
    value: "/api/*"
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: v2m
    value_to_metric: true
    descriptors:
      - key: sub
        value: "x*"
        value_to_metric: true
        rate_limit: {unit: second, requests_per_unit: 1}
  - key: shared
    value: "s*"
    share_threshold: true
    value_to_metric: true
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: det
    descriptors:
      - key: leaf
        detailed_metric: true
        rate_limit: {unit: second, requests_per_unit: 1}
`))
	if err != nil {
		t.Fatal(err)
	}
	dom := snap.Domain("d")
	for _, c := range []struct {
		ents []*rlcommon.RateLimitDescriptor_Entry
		want string
	}{
		{entries("plain", "anything"), "d.plain"},
		{entries("path", "/api/users"), "d.path_/api/*"},
		{entries("v2m", "a", "sub", "xyz"), "d.v2m_a.sub_xyz"},
		{entries("shared", "s123"), "d.shared_s*"},
		{entries("det", "u", "leaf", "l1"), "d.det_u.leaf_l1"},
		// As the incumbent's recorded output has them: the dots of an
		// IPv4-looking run become '_' (every level, every shape), other
		// dots stay, in a detailed value as in a value_to_metric one.
		{entries("det", "10.0.0.0/8", "leaf", "10.1.2.3"), "d.det_10_0_0_0/8.leaf_10_1_2_3"},
		{entries("det", "api.example.com", "leaf", "v1.2.3"), "d.det_api.example.com.leaf_v1.2.3"},
		{entries("v2m", "api.example.com", "sub", "x.y"), "d.v2m_api.example.com.sub_x.y"},
		{entries("v2m", "edge-10.1.2.3.example", "sub", "x1234.5.6.7.8"), "d.v2m_edge-10_1_2_3.example.sub_x1234_5_6_7.8"},
	} {
		r := dom.Match(c.ents)
		if r == nil {
			t.Fatalf("%v matches no rule", c.ents)
		}
		got := r.Path
		if dynamic(r) {
			got = pathOf("d", r, c.ents)
		}
		got = Sanitize(got)
		if got != c.want {
			t.Errorf("%v: path %q, want %q", c.ents, got, c.want)
		}
	}
	if got := pathOf("d", nil, entries("k1", "v1", "k2", "")); got != "d.k1_v1.k2" {
		t.Errorf("override path %q", got)
	}
	if got := Sanitize("d.k_a:b|c\nd"); got != "d.k_a_b_c_d" {
		t.Errorf("Sanitize: %q", got)
	}
}

// TestNameCap: request values add at most NameCap names per rule; later
// ones count under the rule's own path, overrides not at all.
func TestNameCap(t *testing.T) {
	s, err := New(context.Background(), Options{NameCap: 3})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	snap, err := config.Parse("t", []byte("domain: d\ndescriptors:\n  - key: ip\n    detailed_metric: true\n    rate_limit: {unit: second, requests_per_unit: 1}\n"))
	if err != nil {
		t.Fatal(err)
	}
	rs := s.ForRules(snap)
	r := snap.Domain("d").Match(entries("ip", "1"))
	seen := map[*Counters]bool{}
	for i := range 50 {
		seen[rs.For("d", r, entries("ip", string(rune('a'+i))))] = true
	}
	if len(seen) != 4 || !seen[rs.static[r]] {
		t.Errorf("%d distinct counters for 50 values, want 3 and the rule's own", len(seen))
	}
	overrides := 0
	for i := range 50 {
		if rs.For("d", nil, entries("o", string(rune('a'+i)))) != nil {
			overrides++
		}
	}
	if overrides != 3 {
		t.Errorf("%d overrides counted, want 3", overrides)
	}
	for i := range 50 {
		s.DomainNotFound(string(rune('a' + i)))
	}
	if len(s.unknown) != 3 {
		t.Errorf("%d unknown domains named, want 3", len(s.unknown))
	}
}

// TestBadSinks: an address that does not resolve, a port that is not one
// and a mapping that does not parse are errors at once.
func TestBadSinks(t *testing.T) {
	for _, o := range []Options{
		{StatsdAddr: "no-such-host.invalid:8125"},
		{StatsdAddr: "localhost:http"},
		{StatsdAddr: "localhost"},
		{StatsdAddr: "localhost:8125", StatsdProtocol: "sctp"},
	} {
		if _, err := New(context.Background(), o); err == nil {
			t.Errorf("%+v: no error", o)
		}
	}
	// gostats' own variables are read through Options.Getenv, not the
	// process's environment.
	bad := func(name string) string {
		if name == "GOSTATS_FLUSH_INTERVAL_SECONDS" {
			return "soon"
		}
		return ""
	}
	if _, err := New(context.Background(), Options{StatsdAddr: "localhost:8125", Getenv: bad}); err == nil || !strings.Contains(err.Error(), "GOSTATS_FLUSH_INTERVAL_SECONDS") {
		t.Errorf("a bad GOSTATS_FLUSH_INTERVAL_SECONDS from Getenv: %v, want an error naming it", err)
	}
	if _, err := New(context.Background(), Options{StatsdAddr: "no-such-host.invalid:8125"}); !errors.Is(err, ErrAddress) {
		t.Errorf("unresolvable address: %v, want ErrAddress", err)
	}
	if _, err := New(context.Background(), Options{Prometheus: true, Mapping: "mappings:\n  - match: [\n"}); err == nil || !strings.Contains(err.Error(), "statsd_exporter mapping") {
		t.Errorf("bad mapping: %v", err)
	}
	// The incumbent's own file says timer_type: it is read.
	s, err := New(context.Background(), Options{Prometheus: true, Mapping: "mappings:\n  - match: \"ratelimit_server.*.response_time\"\n    name: \"rt\"\n    timer_type: histogram\n    labels: {grpc_method: \"$1\"}\n"})
	if err != nil {
		t.Fatalf("mapping with timer_type: %v", err)
	}
	s.Request(3 * time.Millisecond)
	mfs, err := s.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, mf := range mfs {
		if mf.GetName() == "rt" && len(mf.GetMetric()) == 1 && mf.GetMetric()[0].GetHistogram().GetSampleCount() == 1 {
			found = true
		}
	}
	if !found {
		t.Error("the mapping's rt histogram did not observe the request")
	}
	s.Close()
}

// TestStuckSink: a statsd server that accepts and never reads (or one
// that is not there) never slows the counting a request does: each call
// returns at once, the failure is counted, and Close returns.
func TestStuckSink(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	accepted := make(chan net.Conn, 4)
	go func() {
		for {
			c, err := lis.Accept()
			if err != nil {
				close(accepted)
				return
			}
			accepted <- c // held open, never read
		}
	}()
	defer func() {
		lis.Close()
		for c := range accepted {
			c.Close()
		}
	}()
	deadAddr := refusingAddr(t)

	for _, addr := range []string{lis.Addr().String(), deadAddr} {
		var errs atomic.Int64
		s, err := New(context.Background(), Options{StatsdAddr: addr, FlushInterval: 5 * time.Millisecond, OnSinkError: func(string) { errs.Add(1) }})
		if err != nil {
			t.Fatal(err)
		}
		done := make(chan struct{})
		go func() { s.Run(context.Background()); close(done) }()
		snap, _ := config.Parse("t", []byte("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 10}\n"))
		rs := s.ForRules(snap)
		r := snap.Domain("d").Match(entries("k", "v"))
		// At least about 20 MB of timer lines, far past what the socket
		// buffers and gostats' queue hold, and on until the failure is
		// counted: on a crowded machine the flusher, starved, drops
		// lines its queue cannot take, and fewer reach the socket.
		// A blocked write would take the sink's 1 s write timeout, at
		// every flush; a crowded machine may hold a call or two half
		// that long.
		var slow []time.Duration
		deadline := time.Now().Add(40 * time.Second)
		for i := 0; len(slow) < 3 && (i < 400_000 || errs.Load() == 0 && time.Now().Before(deadline)); i++ {
			start := time.Now()
			s.Request(time.Duration(i) * time.Microsecond)
			c := rs.For("d", r, nil)
			c.Total(1)
			c.Decided(1, 10, uint64(i%12), i%12 >= 10)
			if d := time.Since(start); d > 500*time.Millisecond {
				slow = append(slow, d)
			}
		}
		if len(slow) >= 3 {
			t.Errorf("%s: counting calls took %v", addr, slow)
		}
		if errs.Load() == 0 {
			t.Errorf("%s: no sink failure counted", addr)
		}
		start := time.Now()
		s.Close()
		<-done
		if d := time.Since(start); d > 10*time.Second {
			t.Errorf("%s: Close took %v", addr, d)
		}
	}
}

// BenchmarkCount is the request path's counting: the rule's counters
// found, a decision counted and the request timed, with statsd and the
// Prometheus sink on.
//
//	go test -run XXX -bench Count -benchmem ./internal/incumbentstats/
func BenchmarkCount(b *testing.B) {
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer pc.Close()
	s, err := New(context.Background(), Options{StatsdAddr: pc.LocalAddr().String(), StatsdProtocol: "udp", Prometheus: true})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	snap, _ := config.Parse("t", []byte("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 10}\n"))
	rs := s.ForRules(snap)
	ents := entries("k", "v")
	r := snap.Domain("d").Match(ents)
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		c := rs.For("d", r, ents)
		c.Total(1)
		c.Decided(1, 10, uint64(i%12), i%12 >= 10)
		s.Request(250 * time.Microsecond)
	}
}

// TestCounting: the incumbent's arithmetic for requests of several hits
// that cross the near-limit threshold or the limit.
func TestCounting(t *testing.T) {
	s, err := New(context.Background(), Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for _, c := range []struct {
		name                         string
		hits, limit, before          uint64
		over                         bool
		overLimit, nearLimit, within uint64
	}{
		{"below the threshold", 3, 10, 2, false, 0, 0, 3},
		{"crosses the threshold", 3, 10, 6, false, 0, 1, 3}, // 8 is the threshold: 9 is near
		{"past the threshold", 2, 10, 8, false, 0, 2, 2},
		{"crosses the limit", 5, 10, 8, true, 3, 2, 0},
		{"crosses threshold and limit", 6, 10, 6, true, 2, 2, 0},
		{"already full", 4, 10, 10, true, 4, 0, 0},
	} {
		cs := s.counters("d." + c.name)
		cs.Decided(c.hits, c.limit, c.before, c.over)
		if got := [3]uint64{cs.overLimit.Value(), cs.nearLimit.Value(), cs.withinLimit.Value()}; got != [3]uint64{c.overLimit, c.nearLimit, c.within} {
			t.Errorf("%s: over, near, within = %v, want %v", c.name, got, [3]uint64{c.overLimit, c.nearLimit, c.within})
		}
	}
}

// TestResponseTimeSeconds: the default mapping serves the incumbent's
// millisecond timer as ratelimit_service_response_time_seconds in
// seconds: four requests of 250 µs sum to 1 ms, not to 1 "second".
func TestResponseTimeSeconds(t *testing.T) {
	s, err := New(context.Background(), Options{Prometheus: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for range 4 {
		s.Request(250 * time.Microsecond)
	}
	s.Flush()
	var count uint64
	var sum float64
	// The exporter takes the flushed batch on its own goroutine.
	for deadline := time.Now().Add(10 * time.Second); count < 4 && time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		fams, err := s.Registry().Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range fams {
			if f.GetName() == "ratelimit_service_response_time_seconds" {
				for _, m := range f.GetMetric() {
					count, sum = m.GetHistogram().GetSampleCount(), m.GetHistogram().GetSampleSum()
				}
			}
		}
	}
	if count != 4 || sum < 0.0009 || sum > 0.0011 {
		t.Fatalf("response_time_seconds: %d samples summing to %v s, want 4 summing to 0.001 s", count, sum)
	}
}

// TestNearLimitRatioAndSanitize: a near-limit ratio of 1 is honoured (no
// hit is near the limit before it), one past 1 falls back to 0.8; and a
// stat path keeps its spaces (only ':', '|' and control characters, which
// would break a statsd line, become '_').
func TestNearLimitRatioAndSanitize(t *testing.T) {
	for ratio, wantNear := range map[float64]uint64{1: 0, 1.5: 1, 0.8: 1} {
		s, err := New(context.Background(), Options{NearLimitRatio: ratio})
		if err != nil {
			t.Fatal(err)
		}
		cs := s.counters("d.k")
		cs.Decided(1, 10, 8, false) // the ninth hit of ten
		if got := cs.nearLimit.Value(); got != wantNear {
			t.Errorf("ratio %v: near_limit %d, want %d", ratio, got, wantNear)
		}
		s.Close()
	}
	if got := Sanitize("d.k_a b:c|d\ne"); got != "d.k_a b_c_d_e" {
		t.Errorf("Sanitize = %q, want spaces kept, separators and control characters as _", got)
	}
}

// refusingAddr returns a loopback address that refuses connections for
// the test's life: a socket bound to it and not listening holds the port,
// so that no other process on a busy machine can take it (a listener
// closed at once left the port free for anyone's next listener).
func refusingAddr(t *testing.T) string {
	t.Helper()
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Close(fd) })
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	sa, err := syscall.Getsockname(fd)
	if err != nil {
		t.Fatal(err)
	}
	return net.JoinHostPort("127.0.0.1", fmt.Sprint(sa.(*syscall.SockaddrInet4).Port))
}
