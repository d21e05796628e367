package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	reflectpb "google.golang.org/grpc/reflection/grpc_reflection_v1"

	"github.com/ratelimitd/ratelimitd/internal/redisstore/redistest"
)

const testRules = `
domain: e2e
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 10}
  - key: a
    rate_limit: {unit: hour, requests_per_unit: 10}
  - key: b
    rate_limit: {unit: hour, requests_per_unit: 1000}
  - key: c
    rate_limit: {unit: day, requests_per_unit: 1000}
  - key: many
    rate_limit: {unit: second, requests_per_unit: 1000}
`

func writeRules(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "rules.yaml")
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func env(m map[string]string) func(string) string {
	return func(k string) string { return m[k] }
}

// syncBuffer is a log sink safe for the server's goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

type instance struct {
	grpcAddr, httpAddr string
	log                *syncBuffer
	stop               func() error
}

// start runs the service with args (plus free listen addresses) until the
// test ends, and waits until it answers health checks.
func start(t *testing.T, getenv func(string) string, args ...string) *instance {
	t.Helper()
	in := &instance{grpcAddr: freeAddr(t), httpAddr: freeAddr(t), log: &syncBuffer{}}
	args = append(args, "--grpc-addr", in.grpcAddr, "--http-addr", in.httpAddr)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx, args, getenv, in.log, in.log) }()
	var once sync.Once
	var err error
	in.stop = func() error {
		once.Do(func() {
			cancel()
			select {
			case err = <-done:
			case <-time.After(15 * time.Second):
				err = fmt.Errorf("run did not return 15s after cancel")
			}
		})
		return err
	}
	t.Cleanup(func() {
		if err := in.stop(); err != nil {
			t.Errorf("run: %v\n%s", err, in.log.String())
		}
	})
	deadline := time.Now().Add(10 * time.Second)
	for {
		resp, err := http.Get("http://" + in.httpAddr + "/healthcheck")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return in
			}
		}
		select {
		case err := <-done:
			t.Fatalf("run exited early: %v\n%s", err, in.log.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("not healthy after 10s\n%s", in.log.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func dial(t testing.TB, addr string) *grpc.ClientConn {
	t.Helper()
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return cc
}

func desc(kv ...string) *rlcommon.RateLimitDescriptor {
	d := &rlcommon.RateLimitDescriptor{}
	for i := 0; i+1 < len(kv); i += 2 {
		d.Entries = append(d.Entries, &rlcommon.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	return d
}

func TestStartupErrors(t *testing.T) {
	rules := writeRules(t, testRules)
	bad := writeRules(t, "domain: x\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n")
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	tests := []struct {
		name    string
		args    []string
		env     map[string]string
		wantErr string
	}{
		{"no config", nil, nil, "--config is required"},
		{"missing rules file", []string{"--config", "/nonexistent/rules.yaml"}, nil, "rules: config: stat /nonexistent/rules.yaml"},
		{"invalid rules", []string{"--config", bad}, nil, `rules.yaml:4: descriptors[0].rate_limit.unit: unknown unit "fortnight"`},
		{"bad redis url", []string{"--config", rules, "--redis-url", "http://nope"}, nil, `--redis-url "http://nope": redis: invalid URL scheme: http; want redis://`},
		{"bad redis mode", []string{"--config", rules, "--redis-url", "redis://h:1", "--redis-mode", "ring"}, nil, `--redis-mode "ring": want single, sentinel or cluster`},
		{"redis tls without rediss", []string{"--config", rules, "--redis-url", "redis://h:1", "--redis-tls-ca", rules}, nil, "--redis-tls-* need rediss:// Redis URLs"},
		{"redis ca without certificate", []string{"--config", rules, "--redis-url", "rediss://h:1", "--redis-tls-ca", rules}, nil, "--redis-tls-ca " + rules + ": no PEM certificate in it"},
		{"grpc key without certificate", []string{"--config", rules, "--grpc-tls-cert", rules, "--grpc-tls-key", rules}, nil, "--grpc-tls-cert: tls: failed to find any PEM data in certificate input"},
		{"bad timeout flag", []string{"--config", rules, "--redis-timeout", "soon"}, nil, `invalid value "soon" for flag -redis-timeout`},
		{"bad env", []string{"--config", rules}, map[string]string{"RATELIMITD_LOCAL_CACHE_SIZE": "lots"}, `RATELIMITD_LOCAL_CACHE_SIZE="lots"`},
		{"bad failure mode", []string{"--config", rules, "--failure-mode", "open"}, nil, `unknown failure_mode "open" (want allow or deny)`},
		{"bad log format", []string{"--config", rules, "--log-format", "xml"}, nil, "--log-format must be text or json"},
		{"bad log level", []string{"--config", rules, "--log-level", "loud"}, nil, `invalid value "loud" for flag -log-level`},
		{"stray argument", []string{"--config", rules, "serve"}, nil, `unexpected argument "serve"`},
		{"grpc port in use", []string{"--config", rules, "--grpc-addr", busy.Addr().String(), "--http-addr", "127.0.0.1:0"}, nil, "--grpc-addr: listen tcp " + busy.Addr().String() + ": bind: address already in use"},
		{"http port in use", []string{"--config", rules, "--grpc-addr", "127.0.0.1:0", "--http-addr", busy.Addr().String()}, nil, "--http-addr: listen tcp"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var out syncBuffer
			// Each must fail at startup; one that starts serving instead
			// (its check gone) is stopped, and fails, within a bound,
			// not at the suite's timeout.
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			err := run(ctx, tt.args, env(tt.env), &out, &out)
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("err = %v, want it to contain %q", err, tt.wantErr)
			}
		})
	}
}

func TestFlagWinsOverEnv(t *testing.T) {
	var out syncBuffer
	s, err := parseSettings([]string{"--key-prefix", "flag:", "--response-headers"},
		env(map[string]string{"RATELIMITD_KEY_PREFIX": "env:", "RATELIMITD_CONFIG": "r.yaml", "RATELIMITD_LOCAL_CACHE_SIZE": "64MiB", "RATELIMITD_REDIS_TIMEOUT": "20ms"}), &out)
	if err != nil {
		t.Fatal(err)
	}
	if s.svc.KeyPrefix != "flag:" || s.config != "r.yaml" || s.localCacheSize != 64<<20 || s.responseHeaders.String() != "legacy" || s.redis.Timeout != 20*time.Millisecond {
		t.Errorf("settings = %+v", s)
	}
}

func TestEmbeddedStoreEndToEnd(t *testing.T) {
	in := start(t, env(nil), "--config", writeRules(t, testRules), "--response-headers")
	if !strings.Contains(in.log.String(), "embedded in-memory store; limits are per process") {
		t.Errorf("no per-process warning in the log:\n%s", in.log.String())
	}
	cc := dial(t, in.grpcAddr)
	client := rlsv3.NewRateLimitServiceClient(cc)
	ctx := context.Background()
	for i := range 11 {
		resp, err := client.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "e2e", Descriptors: []*rlcommon.RateLimitDescriptor{desc("user", "u")}})
		if err != nil {
			t.Fatal(err)
		}
		want, headers := rlsv3.RateLimitResponse_OK, 3
		if i == 10 {
			want, headers = rlsv3.RateLimitResponse_OVER_LIMIT, 4 // and Retry-After
		}
		if resp.GetOverallCode() != want || len(resp.GetResponseHeadersToAdd()) != headers {
			t.Fatalf("call %d: %v", i, resp)
		}
	}
	// Errors carry a code and a message naming the problem.
	_, err := client.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Descriptors: []*rlcommon.RateLimitDescriptor{desc("user", "u")}})
	if err == nil || !strings.Contains(err.Error(), "code = InvalidArgument desc = invalid request: domain must not be empty") {
		t.Errorf("empty domain: %v", err)
	}
	// Health for the names Envoy setups use.
	hc := healthpb.NewHealthClient(cc)
	for _, name := range []string{"", "ratelimit", "envoy.service.ratelimit.v3.RateLimitService"} {
		r, err := hc.Check(ctx, &healthpb.HealthCheckRequest{Service: name})
		if err != nil || r.GetStatus() != healthpb.HealthCheckResponse_SERVING {
			t.Errorf("health %q = %v, %v", name, r, err)
		}
	}
	// Reflection lists the RLS service, so grpcurl works.
	stream, err := reflectpb.NewServerReflectionClient(cc).ServerReflectionInfo(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&reflectpb.ServerReflectionRequest{MessageRequest: &reflectpb.ServerReflectionRequest_ListServices{}}); err != nil {
		t.Fatal(err)
	}
	rr, err := stream.Recv()
	if err != nil || !strings.Contains(rr.String(), "envoy.service.ratelimit.v3.RateLimitService") {
		t.Errorf("reflection = %v, %v", rr, err)
	}
	stream.CloseSend()
	// The same decision over HTTP.
	body := `{"domain":"e2e","descriptors":[{"entries":[{"key":"user","value":"u"}]}]}`
	resp, err := http.Post("http://"+in.httpAddr+"/json", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Content-Type") != "application/json" {
		t.Errorf("/json = %d %s", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	mresp, err := http.Get("http://" + in.httpAddr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	mbody, _ := io.ReadAll(mresp.Body)
	mresp.Body.Close()
	for _, want := range []string{
		`ratelimitd_decisions_total{domain="e2e",outcome="over_limit",rule="e2e.user"} 2`,
		`ratelimitd_build_info{goversion=`,
		`ratelimitd_config_reloads_total{result="success"} 1`,
	} {
		if !strings.Contains(string(mbody), want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	if err := in.stop(); err != nil {
		t.Fatal(err)
	}
	if resp, err := http.Get("http://" + in.httpAddr + "/healthcheck"); err == nil {
		resp.Body.Close()
		t.Error("still serving HTTP after shutdown")
	}
}

// awayFromHourBoundary waits, if needed, until Redis's clock is at least
// margin from the next hour, so that a test's counters stay in one window.
func awayFromHourBoundary(t *testing.T, srv *redistest.Server, margin time.Duration) {
	t.Helper()
	now, err := srv.Client().Time(context.Background()).Result()
	if err != nil {
		t.Fatal(err)
	}
	if left := now.Truncate(time.Hour).Add(time.Hour).Sub(now); left < margin {
		time.Sleep(left + time.Second)
	}
}

// TestConcurrentExactLimit fires 200 requests at once over 20 gRPC
// connections at one counter with a limit of 10: exactly 10 may pass,
// every round, with 1 descriptor per request and with 3.
func TestConcurrentExactLimit(t *testing.T) {
	srv := redistest.Start(t)
	in := start(t, env(map[string]string{"RATELIMITD_REDIS_URL": srv.URL()}), "--config", writeRules(t, testRules), "--redis-timeout", "2s")
	conns := make([]rlsv3.RateLimitServiceClient, 20)
	for i := range conns {
		conns[i] = rlsv3.NewRateLimitServiceClient(dial(t, in.grpcAddr))
	}
	for _, descs := range []int{1, 3} {
		for round := range 5 {
			awayFromHourBoundary(t, srv, 10*time.Second)
			id := fmt.Sprintf("%d-%d", descs, round)
			req := &rlsv3.RateLimitRequest{Domain: "e2e", Descriptors: []*rlcommon.RateLimitDescriptor{desc("a", id)}}
			if descs == 3 {
				req.Descriptors = append(req.Descriptors, desc("b", id), desc("c", id))
			}
			var ok, over atomic.Int64
			var wg sync.WaitGroup
			startGun := make(chan struct{})
			for i := range 200 {
				wg.Go(func() {
					<-startGun
					resp, err := conns[i%len(conns)].ShouldRateLimit(context.Background(), req)
					switch {
					case err != nil:
						t.Error(err)
					case resp.GetOverallCode() == rlsv3.RateLimitResponse_OK:
						ok.Add(1)
					default:
						over.Add(1)
					}
				})
			}
			close(startGun)
			wg.Wait()
			if ok.Load() != 10 || over.Load() != 190 {
				t.Errorf("%d descriptors, round %d: %d OK, %d over, want exactly 10 OK", descs, round, ok.Load(), over.Load())
			}
			if descs == 3 {
				// The 190 rejected requests consumed nothing of b and c.
				vals, err := srv.Client().Keys(context.Background(), "*"+id+"*").Result()
				if err != nil || len(vals) != 3 {
					t.Fatalf("keys for %s = %v, %v", id, vals, err)
				}
				for _, k := range vals {
					v := srv.Client().Get(context.Background(), k).Val()
					if !strings.HasSuffix(v, ":10") {
						t.Errorf("%s = %q, want a count of 10", k, v)
					}
				}
			}
		}
	}
}

// TestEveryKeyHasTTL runs traffic on many keys and then checks every key
// in the Redis database has an expiry, and measures the Redis commands per
// request.
func TestEveryKeyHasTTL(t *testing.T) {
	srv := redistest.Start(t)
	// Hour windows: every key made is still there when they are listed,
	// however slowly a busy machine sends the requests (one-second keys
	// expired before the listing when it took over two seconds).
	rules := strings.Replace(testRules, "key: many\n    rate_limit: {unit: second", "key: many\n    rate_limit: {unit: hour", 1)
	redistest.AwayFromHourEnd(time.Minute)
	in := start(t, env(nil), "--config", writeRules(t, rules), "--redis-url", srv.URL(), "--redis-timeout", "2s")
	client := rlsv3.NewRateLimitServiceClient(dial(t, in.grpcAddr))
	ctx := context.Background()
	// Commands per request, from INFO commandstats (commands a script
	// runs count too), for 1 and then 3 descriptors.
	const n = 150
	for _, descs := range []int{1, 3} {
		before, err := srv.CommandStats(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for i := range n {
			v := fmt.Sprint(descs, "-", i)
			req := &rlsv3.RateLimitRequest{Domain: "e2e", Descriptors: []*rlcommon.RateLimitDescriptor{desc("many", v)}}
			if descs == 3 {
				req.Descriptors = append(req.Descriptors, desc("b", v), desc("c", v))
			}
			if _, err := client.ShouldRateLimit(ctx, req); err != nil {
				t.Fatal(err)
			}
		}
		after, err := srv.CommandStats(ctx)
		if err != nil {
			t.Fatal(err)
		}
		per := func(cmd string) float64 { return float64(after[cmd]-before[cmd]) / n }
		if per("evalsha")+per("eval") != 1 {
			t.Errorf("%d descriptors: %.2f script calls per request, want exactly 1", descs, per("evalsha")+per("eval"))
		}
		// info itself is the one command outside the requests.
		var total int64
		for cmd, calls := range after {
			if cmd != "info" {
				total += calls - before[cmd]
			}
		}
		t.Logf("%d descriptor(s) per request: %.2f commands per request: evalsha %.2f (round trips), in the script: time %.2f, mget %.2f, set %.2f",
			descs, float64(total)/n, per("evalsha"), per("time"), per("mget"), per("set"))
		// One read of all the keys per script call, one write per key.
		if per("mget") != 1 || per("get") != 0 || per("set") != float64(descs) {
			t.Errorf("%d descriptors: %.2f MGET, %.2f GET, %.2f SET per request, want 1, 0, %d", descs, per("mget"), per("get"), per("set"), descs)
		}
	}
	rdb := srv.Client()
	keys, err := rdb.Keys(ctx, "*").Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(keys) != 4*n {
		t.Fatalf("%d keys after %d requests, want %d", len(keys), 2*n, 4*n)
	}
	for _, k := range keys {
		if ttl := rdb.PTTL(ctx, k).Val(); ttl <= 0 {
			t.Errorf("key %q has TTL %v", k, ttl)
		}
	}
}

// TestProductionSendsNoTime watches Redis with MONITOR while the service
// decides: every script call asks Redis for the time (ARGV[1] "0"); the
// explicit time the script accepts is for tests only.
func TestProductionSendsNoTime(t *testing.T) {
	srv := redistest.Start(t)
	rules := testRules + "  - key: tb\n    rate_limit: {unit: second, requests_per_unit: 5, algorithm: token_bucket}\n  - key: sw\n    rate_limit: {unit: second, requests_per_unit: 5, algorithm: sliding_window}\n"
	in := start(t, env(nil), "--config", writeRules(t, rules), "--redis-url", srv.URL(), "--redis-timeout", "2s")
	client := rlsv3.NewRateLimitServiceClient(dial(t, in.grpcAddr))
	// MONITOR on a raw connection: go-redis's MonitorCmd reads from a
	// busy loop that stops for good at its first read timeout, which made
	// this test flaky on a loaded machine. Redis answers +OK once the
	// monitor is in place, so no call can slip by before it.
	mon, err := net.DialTimeout("tcp", srv.Addr(), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer mon.Close()
	if _, err := mon.Write([]byte("MONITOR\r\n")); err != nil {
		t.Fatal(err)
	}
	rd := bufio.NewReader(mon)
	if ok, err := rd.ReadString('\n'); err != nil || ok != "+OK\r\n" {
		t.Fatalf("MONITOR: %q, %v", ok, err)
	}
	lines := make(chan string, 100)
	go func() {
		for {
			line, err := rd.ReadString('\n')
			if err != nil {
				return
			}
			lines <- strings.TrimPrefix(strings.TrimRight(line, "\r\n"), "+")
		}
	}()
	const n = 10
	for i := range n {
		req := &rlsv3.RateLimitRequest{Domain: "e2e", Descriptors: []*rlcommon.RateLimitDescriptor{desc("user", fmt.Sprint(i)), desc("tb", "x"), desc("sw", "y")}}
		if _, err := client.ShouldRateLimit(context.Background(), req); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.After(5 * time.Second)
	seen := 0
	for seen < n {
		select {
		case line := <-lines:
			f := strings.Fields(line)
			if len(f) < 5 || !strings.EqualFold(strings.Trim(f[3], `"`), "evalsha") {
				continue
			}
			keys, err := strconv.Atoi(strings.Trim(f[5], `"`))
			if err != nil || len(f) <= 6+keys {
				t.Fatalf("cannot parse %q", line)
			}
			if argv1 := strings.Trim(f[6+keys], `"`); argv1 != "0" {
				t.Errorf("script called with an explicit time %s: %s", argv1, line)
			}
			seen++
		case <-deadline:
			t.Fatalf("saw %d of %d script calls", seen, n)
		}
	}
}
