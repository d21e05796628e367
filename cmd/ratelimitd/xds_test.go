package main

import (
	"context"
	"crypto/tls"
	"fmt"
	"strings"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	"github.com/ratelimitd/ratelimitd/internal/redisstore/redistest"
	"github.com/ratelimitd/ratelimitd/internal/xds/xdstest"
)

// limitServed asks in for domain's k=v and returns the limit in force,
// 0 when no rule matches.
func limitServed(t *testing.T, client rlsv3.RateLimitServiceClient, domain string) uint32 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := client.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: domain, Descriptors: []*rlcommon.RateLimitDescriptor{desc("k", "v")}})
	if err != nil {
		t.Fatal(err)
	}
	return resp.GetStatuses()[0].GetCurrentLimit().GetRequestsPerUnit()
}

// TestRulesOverXDS starts ratelimitd with envoyproxy/ratelimit's xDS
// environment (CONFIG_TYPE=GRPC_XDS_SOTW) against a real go-control-plane
// management server: it waits for and serves the first set, takes an
// update, keeps the rules in force when an invalid set comes (NACKed,
// counted as a failed load, logged with the error), and takes the set of
// a management server restarted on the same address.
func TestRulesOverXDS(t *testing.T) {
	mgmt := xdstest.Start(t, "127.0.0.1:0")
	mgmt.Set("rl-node", "1", xdstest.Limit("ops", "ops", "k", "", 5))
	in := start(t, env(map[string]string{
		"RATELIMITD_ENV_COMPAT":               "envoyproxy",
		"CONFIG_TYPE":                         "GRPC_XDS_SOTW",
		"CONFIG_GRPC_XDS_SERVER_URL":          mgmt.Addr,
		"CONFIG_GRPC_XDS_NODE_ID":             "rl-node",
		"CONFIG_GRPC_XDS_NODE_METADATA":       "zone=z1,team=edge",
		"XDS_CLIENT_BACKOFF_INITIAL_INTERVAL": "20ms",
		"XDS_CLIENT_BACKOFF_MAX_INTERVAL":     "200ms",
		"XDS_CLIENT_BACKOFF_JITTER":           "true",
	}))
	client := rlsv3.NewRateLimitServiceClient(dial(t, in.grpcAddr))
	if got := limitServed(t, client, "ops"); got != 5 {
		t.Fatalf("first set: limit %d, want 5\n%s", got, in.log.String())
	}
	if md := mgmt.Requests()[0].GetNode().GetMetadata().GetFields(); md["zone"].GetStringValue() != "z1" || md["team"].GetStringValue() != "edge" {
		t.Errorf("node metadata sent: %v", md)
	}
	if !strings.Contains(in.log.String(), "XDS_CLIENT_BACKOFF_JITTER: the wait is always jittered") {
		t.Errorf("ignored xDS variable not listed:\n%s", in.log.String())
	}
	if scrape(t, in.httpAddr, "ratelimitd_xds_connected") != "1" {
		t.Error("ratelimitd_xds_connected is not 1 with the stream open")
	}

	mgmt.Set("rl-node", "2", xdstest.Limit("ops", "ops", "k", "", 7))
	eventually(t, "update to 7", func() error {
		if got := limitServed(t, client, "ops"); got != 7 {
			return fmt.Errorf("limit %d", got)
		}
		return nil
	})

	mgmt.Set("rl-node", "3", xdstest.Limit("ops", "ops", "k", "", 1), xdstest.Limit("ops-again", "ops", "k", "", 1))
	eventually(t, "invalid set counted", func() error {
		if v := scrape(t, in.httpAddr, `ratelimitd_config_reloads_total{result="failure"}`); v != "1" {
			return fmt.Errorf("failures %q", v)
		}
		return nil
	})
	nack := mgmt.WaitFor(5*time.Second, func(r *discovery.DiscoveryRequest) bool { return r.GetErrorDetail() != nil })
	if nack == nil || !strings.Contains(nack.GetErrorDetail().GetMessage(), `ops-again: duplicate domain "ops"`) {
		t.Errorf("NACK: %v", nack)
	}
	if got := limitServed(t, client, "ops"); got != 7 {
		t.Errorf("after an invalid set: limit %d, want the 7 in force", got)
	}
	if !strings.Contains(in.log.String(), "rules reload failed; keeping the rules in force") {
		t.Errorf("invalid set not logged:\n%s", in.log.String())
	}

	addr := mgmt.Addr
	mgmt.Stop()
	eventually(t, "stream down", func() error {
		if v := scrape(t, in.httpAddr, "ratelimitd_xds_connected"); v != "0" {
			return fmt.Errorf("ratelimitd_xds_connected %q", v)
		}
		return nil
	})
	if got := limitServed(t, client, "ops"); got != 7 {
		t.Errorf("with the management server down: limit %d, want the 7 in force", got)
	}
	mgmt = xdstest.Start(t, addr)
	mgmt.Set("rl-node", "4", xdstest.Limit("ops", "ops", "k", "", 9))
	eventually(t, "the restarted server's set", func() error {
		if got := limitServed(t, client, "ops"); got != 9 {
			return fmt.Errorf("limit %d", got)
		}
		return nil
	})
}

// TestRulesOverXDSTLS: with --xds-tls-* the stream is mutual TLS; a
// management server whose certificate another CA signed gives no rules
// (and with --xds-start-without-rules the service answers meanwhile).
func TestRulesOverXDSTLS(t *testing.T) {
	certs, other := redistest.NewCerts(t), redistest.NewCerts(t)
	serverTLS := func(c *redistest.Certs) grpc.ServerOption { return mtlsServer(t, c, certs.CA) }
	args := func(addr string) []string {
		return []string{"--xds-server", addr, "--xds-tls-ca", certs.CA, "--xds-tls-cert", certs.ClientCert,
			"--xds-tls-key", certs.ClientKey, "--xds-backoff-initial", "20ms", "--xds-backoff-max", "100ms"}
	}

	good := xdstest.Start(t, "127.0.0.1:0", serverTLS(certs))
	good.Set("default", "1", xdstest.Limit("ops", "ops", "k", "", 3))
	in := start(t, env(nil), args(good.Addr)...)
	if got := limitServed(t, rlsv3.NewRateLimitServiceClient(dial(t, in.grpcAddr)), "ops"); got != 3 {
		t.Fatalf("over mTLS: limit %d, want 3\n%s", got, in.log.String())
	}

	impostor := xdstest.Start(t, "127.0.0.1:0", serverTLS(other))
	impostor.Set("default", "1", xdstest.Limit("ops", "ops", "k", "", 4))
	in = start(t, env(nil), append(args(impostor.Addr), "--xds-start-without-rules")...)
	client := rlsv3.NewRateLimitServiceClient(dial(t, in.grpcAddr))
	time.Sleep(300 * time.Millisecond) // several attempts
	// No rules yet: UNAVAILABLE by default, so that Envoy's
	// failure_mode_deny decides (as with the incumbent) ...
	_, err := client.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "ops", Descriptors: []*rlcommon.RateLimitDescriptor{desc("k", "v")}})
	if status.Code(err) != codes.Unavailable {
		t.Errorf("rules taken from a server another CA vouches for, or no rules answered otherwise than UNAVAILABLE: %v", err)
	}
	// ... or OK with --xds-before-rules=ok.
	in2 := start(t, env(nil), append(args(impostor.Addr), "--xds-start-without-rules", "--xds-before-rules=ok")...)
	if got := limitServed(t, rlsv3.NewRateLimitServiceClient(dial(t, in2.grpcAddr)), "ops"); got != 0 {
		t.Errorf("rules taken from a server another CA vouches for: limit %d", got)
	}
	if !strings.Contains(in.log.String(), "certificate signed by unknown authority") {
		t.Errorf("the refused certificate is not logged:\n%s", in.log.String())
	}
}

// mtlsServer is a gRPC server option serving c's server certificate and
// requiring client certificates that clientCA signs.
func mtlsServer(t *testing.T, c *redistest.Certs, clientCA string) grpc.ServerOption {
	t.Helper()
	pair, err := tls.LoadX509KeyPair(c.ServerCert, c.ServerKey)
	if err != nil {
		t.Fatal(err)
	}
	pool, err := loadPool("client ca", clientCA)
	if err != nil {
		t.Fatal(err)
	}
	return grpc.Creds(credentials.NewTLS(&tls.Config{Certificates: []tls.Certificate{pair}, ClientCAs: pool,
		ClientAuth: tls.RequireAndVerifyClientCert, MinVersion: tls.VersionTLS12}))
}
