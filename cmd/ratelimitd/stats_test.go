package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// statsdServer is a statsd server for tests, over TCP or UDP: it sums
// the counters it is sent and counts the timer samples.
type statsdServer struct {
	addr string
	mu   sync.Mutex
	sums map[string]float64 // counters: summed; timers: samples; gauges: last
	kind map[string]string
}

func startStatsd(t *testing.T, proto string) *statsdServer {
	t.Helper()
	s := &statsdServer{sums: map[string]float64{}, kind: map[string]string{}}
	var wg sync.WaitGroup
	switch proto {
	case "tcp":
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		s.addr = lis.Addr().String()
		var conns sync.Map
		wg.Go(func() {
			for {
				c, err := lis.Accept()
				if err != nil {
					return
				}
				conns.Store(c, true)
				wg.Go(func() { s.read(c) })
			}
		})
		t.Cleanup(func() {
			lis.Close()
			conns.Range(func(c, _ any) bool { c.(net.Conn).Close(); return true })
			wg.Wait()
		})
	case "udp":
		pc, err := net.ListenPacket("udp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		s.addr = pc.LocalAddr().String()
		wg.Go(func() {
			buf := make([]byte, 65536)
			for {
				n, _, err := pc.ReadFrom(buf)
				if err != nil {
					return
				}
				s.read(strings.NewReader(string(buf[:n])))
			}
		})
		t.Cleanup(func() { pc.Close(); wg.Wait() })
	}
	return s
}

func (s *statsdServer) read(r io.Reader) {
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		name, rest, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		// value|type, then DogStatsD's |#tags (kept, sorted, with the name).
		parts := strings.Split(rest, "|")
		if len(parts) < 2 {
			continue
		}
		val, typ := parts[0], parts[1]
		for _, p := range parts[2:] {
			if tags, ok := strings.CutPrefix(p, "#"); ok {
				t := strings.Split(tags, ",")
				slices.Sort(t)
				name += " #" + strings.Join(t, ",")
			}
		}
		v, err := strconv.ParseFloat(val, 64)
		if err != nil {
			continue
		}
		s.mu.Lock()
		s.kind[name] = typ
		switch typ {
		case "c":
			s.sums[name] += v
		case "ms":
			s.sums[name]++
		default:
			s.sums[name] = v
		}
		s.mu.Unlock()
	}
}

// lines renders what arrived, one "name type value" a line, sorted,
// leaving out the Go runtime's stats (whose values vary).
func (s *statsdServer) lines() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for name, v := range s.sums {
		if !strings.HasPrefix(name, "ratelimit.go.") {
			out = append(out, fmt.Sprintf("%s %s %v", name, s.kind[name], v))
		}
	}
	slices.Sort(out)
	return strings.Join(out, "\n") + "\n"
}

func (s *statsdServer) has(prefix string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for name := range s.sums {
		if strings.HasPrefix(name, prefix) {
			return true
		}
	}
	return false
}

// statsRules exercise each way the incumbent names a rule's stats.
const statsRules = `domain: gw
descriptors:
  - key: k1
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: route
    value: r1
    descriptors:
      - key: user
        rate_limit: {unit: minute, requests_per_unit: 2}
  - key: det
    detailed_metric: true
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: sh
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: unl
    rate_limit: {unlimited: true}
`

// statsTraffic is the fixed traffic script: one hit a request, one
// descriptor each; then a refund (is_negative_hits: not a hit, so no
// total_hits) and an invalid request (should_rate_limit.service_error).
func statsTraffic(t *testing.T, client rlsv3.RateLimitServiceClient) {
	t.Helper()
	ask := func(n int, domain string, kv ...string) {
		for range n {
			_, err := client.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: domain,
				Descriptors: []*rlcommon.RateLimitDescriptor{desc(kv...)}})
			if err != nil {
				t.Fatal(err)
			}
		}
	}
	ask(7, "gw", "k1", "x")
	ask(3, "gw", "route", "r1", "user", "alice")
	ask(2, "gw", "det", "v1")
	ask(2, "gw", "sh", "z")
	ask(1, "gw", "unl", "q")
	ask(1, "nope", "k1", "x")
	refund := desc("k1", "x")
	refund.IsNegativeHits, refund.HitsAddend = true, wrapperspb.UInt64(2)
	if _, err := client.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "gw",
		Descriptors: []*rlcommon.RateLimitDescriptor{refund}}); err != nil {
		t.Fatal(err)
	}
	_, err := client.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "",
		Descriptors: []*rlcommon.RateLimitDescriptor{desc("k1", "x")}})
	if status.Code(err) != codes.InvalidArgument {
		t.Fatalf("a request without a domain: %v, want InvalidArgument", err)
	}
}

// golden compares got with testdata/name, rewriting it under -update.
func golden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if os.Getenv("RATELIMITD_UPDATE_GOLDEN") == "1" {
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if got != string(want) {
		t.Errorf("%s differs:\n--- got\n%s--- want\n%s", name, got, want)
	}
}

// TestIncumbentStats runs a traffic script of its own with the
// incumbent's stats environment (statsd over TCP, then UDP; the Prometheus
// sink with the default mapping) and compares what arrives with golden
// files of ratelimitd's own output (RATELIMITD_UPDATE_GOLDEN=1 rewrites
// them): testdata/incumbent_statsd.golden (name, statsd type, sum; timers
// are sample counts) and testdata/incumbent_prometheus.golden. They pin
// the sinks, the protocols and the stats the recording has no traffic for
// (domain_not_found, request-level errors, timers); what the incumbent
// emits is held to its recorded output by TestIncumbentRecorded, whose
// shapes these goldens agree with (three-part keys labelled key1 and
// key2).
func TestIncumbentStats(t *testing.T) {
	for _, proto := range []string{"tcp", "udp"} {
		t.Run(proto, func(t *testing.T) {
			sd := startStatsd(t, proto)
			host, port, _ := net.SplitHostPort(sd.addr)
			promAddr := freeAddr(t)
			in := start(t, env(map[string]string{
				"RATELIMITD_ENV_COMPAT": "envoyproxy",
				"USE_STATSD":            "true",
				"STATSD_HOST":           host,
				"STATSD_PORT":           port,
				"STATSD_PROTOCOL":       proto,
				"STATS_FLUSH_INTERVAL":  "50ms",
				"USE_PROMETHEUS":        "true",
				"PROMETHEUS_ADDR":       promAddr,
			}), "--config", writeRules(t, statsRules))
			statsTraffic(t, rlsv3.NewRateLimitServiceClient(dial(t, in.grpcAddr)))

			wantStatsd, err := os.ReadFile(filepath.Join("testdata", "incumbent_statsd.golden"))
			if err != nil {
				t.Fatal(err)
			}
			wantProm, err := os.ReadFile(filepath.Join("testdata", "incumbent_prometheus.golden"))
			if err != nil {
				t.Fatal(err)
			}
			// The counters arrive as deltas over several flushes: wait
			// until the sums settle on the golden set (or time runs out
			// and the difference is reported).
			deadline := time.Now().Add(15 * time.Second)
			for (sd.lines() != string(wantStatsd) || promLines(t, promAddr) != string(wantProm)) && time.Now().Before(deadline) {
				time.Sleep(50 * time.Millisecond)
			}
			golden(t, "incumbent_statsd.golden", sd.lines())
			golden(t, "incumbent_prometheus.golden", promLines(t, promAddr))
			if !sd.has("ratelimit.go.") {
				t.Error("no Go runtime stats (ratelimit.go.*) sent")
			}
			if v := scrapeAt(t, "http://"+promAddr+"/metrics", "process_cpu_seconds_total"); v == "" {
				t.Error("no process metrics on the Prometheus sink")
			}
		})
	}
}

// promLines are the incumbent-named series the Prometheus sink serves,
// sorted: ratelimit_service_*, with the response time as its count only.
func promLines(t *testing.T, addr string) string {
	t.Helper()
	var out []string
	for _, l := range strings.Split(get(t, "http://"+addr+"/metrics"), "\n") {
		if !strings.HasPrefix(l, "ratelimit_service_") || strings.HasPrefix(l, "ratelimit_service_response_time_seconds_") && !strings.Contains(l, "_count") {
			continue
		}
		out = append(out, l)
	}
	slices.Sort(out)
	return strings.Join(out, "\n") + "\n"
}

// TestDogStatsd: with USE_DOG_STATSD the stats go to a DogStatsD agent
// over UDP, EXTRA_TAGS as DogStatsD tags, renamed by the incumbent's
// mogrifiers (here: the key path into tags, as DataDog users configure
// it).
func TestDogStatsd(t *testing.T) {
	sd := startStatsd(t, "udp")
	host, port, _ := net.SplitHostPort(sd.addr)
	in := start(t, env(map[string]string{
		"RATELIMITD_ENV_COMPAT":             "envoyproxy",
		"USE_DOG_STATSD":                    "true",
		"STATSD_HOST":                       host,
		"STATSD_PORT":                       port,
		"STATS_FLUSH_INTERVAL":              "50ms",
		"EXTRA_TAGS":                        "env:test",
		"USE_DOG_STATSD_MOGRIFIERS":         "RULE",
		"DOG_STATSD_MOGRIFIER_RULE_PATTERN": `^ratelimit\.service\.rate_limit\.([^.]+)\.(.+)\.([a-z_]+)$`,
		"DOG_STATSD_MOGRIFIER_RULE_NAME":    "ratelimit.service.rate_limit.$3",
		"DOG_STATSD_MOGRIFIER_RULE_TAGS":    "domain:$1,descriptor:$2",
	}), "--config", writeRules(t, statsRules))
	statsTraffic(t, rlsv3.NewRateLimitServiceClient(dial(t, in.grpcAddr)))
	want := map[string]float64{
		"ratelimit.service.rate_limit.total_hits #descriptor:k1,domain:gw,env:test":            7,
		"ratelimit.service.rate_limit.over_limit #descriptor:route_r1.user,domain:gw,env:test": 1,
		"ratelimit.service.rate_limit.shadow_mode #descriptor:sh,domain:gw,env:test":           1,
		"ratelimit_server.ShouldRateLimit.total_requests #env:test":                            18,
		"ratelimit_server.ShouldRateLimit.response_time #env:test":                             18,
		"ratelimit.service.config_load_success #env:test":                                      1,
	}
	eventuallyWithin(t, 20*time.Second, "DogStatsD stats", func() error {
		sd.mu.Lock()
		defer sd.mu.Unlock()
		for name, v := range want {
			if sd.sums[name] != v {
				return fmt.Errorf("%s = %v, want %v; got %v", name, sd.sums[name], v, sd.sums)
			}
		}
		return nil
	})
	// A mogrifier without a pattern is a startup error naming it.
	err := run(context.Background(), nil, env(map[string]string{"RATELIMITD_ENV_COMPAT": "envoyproxy", "USE_DOG_STATSD": "true",
		"USE_DOG_STATSD_MOGRIFIERS": "X", "DOG_STATSD_MOGRIFIER_X_NAME": "n"}), &syncBuffer{}, &syncBuffer{})
	if err == nil || !strings.Contains(err.Error(), "DOG_STATSD_MOGRIFIER_X_PATTERN") {
		t.Errorf("mogrifier without a pattern: %v", err)
	}
}
