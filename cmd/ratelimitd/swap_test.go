package main

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	rlsconf "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/ratelimitd/ratelimitd/internal/redisstore/redistest"
	"github.com/ratelimitd/ratelimitd/internal/xds/xdstest"
)

// TestImageSwap runs ratelimitd as Envoy Gateway runs envoyproxy/ratelimit:
// a binary named ratelimit, no arguments, and only the environment Envoy
// Gateway's rate-limit Deployment sets (rules over xDS with mTLS, gRPC
// over TLS, statsd to the exporter beside it, Redis by host:port). It
// serves /healthcheck on PORT, takes a set holding a MONTH policy (which
// a v0.1.0 client once NACKed, freezing every update), enforces an
// unrelated policy of the same set, and sends the incumbent's stats.
func TestImageSwap(t *testing.T) {
	rds := redistest.Start(t)
	certs := redistest.NewCerts(t)
	mgmt := xdstest.Start(t, "127.0.0.1:0", mtlsServer(t, certs, certs.CA))
	mgmt.Set("envoy-ratelimit", "1",
		&rlsconf.RateLimitConfig{Name: "monthly", Domain: "gw-monthly", Descriptors: []*rlsconf.RateLimitDescriptor{
			{Key: "route", RateLimit: &rlsconf.RateLimitPolicy{Unit: 5, RequestsPerUnit: 1000}}}},
		&rlsconf.RateLimitConfig{Name: "hourly", Domain: "gw", Descriptors: []*rlsconf.RateLimitDescriptor{
			{Key: "ip", RateLimit: &rlsconf.RateLimitPolicy{Unit: rlsconf.RateLimitUnit_HOUR, RequestsPerUnit: 5}}}})
	sd := startStatsd(t, "tcp")
	statsdHost, statsdPort, _ := net.SplitHostPort(sd.addr)
	proc := runAsIncumbent(t, map[string]string{
		// Envoy Gateway's Deployment, as it writes it:
		"RUNTIME_ROOT": "/data", "RUNTIME_SUBDIRECTORY": "ratelimit", "RUNTIME_IGNOREDOTFILES": "true", "RUNTIME_WATCH_ROOT": "false",
		"LOG_LEVEL": "info", "USE_STATSD": "true", "STATSD_PORT": statsdPort, "CONFIG_TYPE": "GRPC_XDS_SOTW",
		"CONFIG_GRPC_XDS_SERVER_URL": mgmt.Addr, "CONFIG_GRPC_XDS_NODE_ID": "envoy-ratelimit",
		"GRPC_SERVER_USE_TLS": "true", "GRPC_SERVER_TLS_CERT": certs.ServerCert, "GRPC_SERVER_TLS_KEY": certs.ServerKey,
		"GRPC_SERVER_TLS_CA_CERT": certs.CA, "CONFIG_GRPC_XDS_SERVER_USE_TLS": "true",
		"CONFIG_GRPC_XDS_CLIENT_TLS_CERT": certs.ClientCert, "CONFIG_GRPC_XDS_CLIENT_TLS_KEY": certs.ClientKey,
		"CONFIG_GRPC_XDS_SERVER_TLS_CACERT": certs.CA, "FORCE_START_WITHOUT_INITIAL_CONFIG": "true",
		"REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": rds.Addr(),
		// Only what a test must change (runAsIncumbent sets the free
		// ports): the statsd host, a short flush so the stats show
		// within the test.
		"STATSD_HOST": statsdHost, "STATS_FLUSH_INTERVAL": "100ms",
	})

	pool, err := loadPool("ca", certs.CA)
	if err != nil {
		t.Fatal(err)
	}
	cc, err := grpc.NewClient(proc.grpcAddr, grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12})))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	client := rlsv3.NewRateLimitServiceClient(cc)
	ask := func(domain, key, value string) (*rlsv3.RateLimitResponse, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		return client.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: domain, Descriptors: []*rlcommon.RateLimitDescriptor{desc(key, value)}})
	}
	// Rules come over xDS after the service started (FORCE_START_...).
	deadline := time.Now().Add(20 * time.Second)
	for {
		r, err := ask("gw-monthly", "route", "r1")
		if err == nil && r.GetStatuses()[0].GetCurrentLimit().GetUnit() == rlsv3.RateLimitResponse_RateLimit_MONTH {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the MONTH policy is not served: %v %v\n%s", r, err, proc.log.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	redistest.AwayFromHourEnd(5 * time.Second)
	ok := 0
	for range 8 {
		r, err := ask("gw", "ip", "10.0.0.1")
		if err != nil {
			t.Fatal(err)
		}
		if r.GetOverallCode() == rlsv3.RateLimitResponse_OK {
			ok++
		}
	}
	if ok != 5 {
		t.Errorf("%d of 8 admitted by the 5/hour policy, want 5", ok)
	}
	eventuallyWithin(t, 20*time.Second, "the incumbent's stats at the statsd server", func() error {
		if !sd.has("ratelimit.service.rate_limit.gw.ip.over_limit") || !sd.has("ratelimit_server.ShouldRateLimit.total_requests") {
			return fmt.Errorf("got:\n%s", sd.lines())
		}
		return nil
	})
}

// TestEnvFor: under the incumbent's name the environment is read as the
// incumbent's unless RATELIMITD_ENV_COMPAT says otherwise; under any
// other name nothing changes.
func TestEnvFor(t *testing.T) {
	for _, c := range []struct {
		argv0, set, want string
	}{
		{"/bin/ratelimit", "", "envoyproxy"},
		{"ratelimit.exe", "", "envoyproxy"},
		{"/bin/ratelimit", "none", "none"},
		{"/ratelimitd", "", ""},
		{"/usr/local/bin/ratelimitd", "envoyproxy", "envoyproxy"},
	} {
		got := envFor(c.argv0, env(map[string]string{envPrefix + "ENV_COMPAT": c.set, "PORT": "1"}))
		if v := got(envPrefix + "ENV_COMPAT"); v != c.want {
			t.Errorf("%s with %q: %q, want %q", c.argv0, c.set, v, c.want)
		}
		if got("PORT") != "1" {
			t.Errorf("%s: other variables changed", c.argv0)
		}
	}
	// none turns it off: the incumbent's variables then mean nothing.
	if _, err := parseSettings(nil, envFor("/bin/ratelimit", env(map[string]string{envPrefix + "ENV_COMPAT": "none", "RUNTIME_SUBDIRECTORY": "x"})), io.Discard); err == nil || !strings.Contains(err.Error(), "--config is required") {
		t.Errorf("ENV_COMPAT=none: %v", err)
	}
}
