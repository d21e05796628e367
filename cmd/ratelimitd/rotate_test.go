package main

import (
	"context"
	"crypto/tls"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/ratelimitd/ratelimitd/internal/redisstore/redistest"
)

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	b, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// replace writes from's content to a temporary file beside to and renames
// it over to, as cert-manager and editors do.
func replace(t *testing.T, from, to string) {
	t.Helper()
	tmp := to + ".tmp"
	copyFile(t, from, tmp)
	if err := os.Rename(tmp, to); err != nil {
		t.Fatal(err)
	}
}

// handshake opens a new gRPC connection with conf and makes one call.
func handshake(addr string, conf *tls.Config) error {
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(conf)))
	if err != nil {
		return err
	}
	defer cc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_, err = rlsv3.NewRateLimitServiceClient(cc).ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "res",
		Descriptors: []*rlcommon.RateLimitDescriptor{desc("browse", "x")}})
	return err
}

// eventually waits up to 2 s for ok.
func eventually(t *testing.T, what string, ok func() error) {
	t.Helper()
	eventuallyWithin(t, 2*time.Second, what, ok)
}

// eventuallyWithin retries ok every 20 ms until it passes or d is over.
func eventuallyWithin(t *testing.T, d time.Duration, what string, ok func() error) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		err := ok()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v: %v", what, d, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestCertificateRotation replaces the served certificate pair and the
// client CA under a running server, as cert-manager (rename over) and a
// Kubernetes Secret volume (the "..data" symlink swap) do: within 2 s new
// connections get the new pair and are checked against the new client
// CA; a pair that does not load keeps the old one, counted as a failed
// reload; connections made meanwhile keep working.
func TestCertificateRotation(t *testing.T) {
	a, b, c := redistest.NewCerts(t), redistest.NewCerts(t), redistest.NewCerts(t)
	dir := t.TempDir()
	cert, key, ca := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key"), filepath.Join(dir, "ca.crt")
	copyFile(t, a.ServerCert, cert)
	copyFile(t, a.ServerKey, key)
	copyFile(t, a.CA, ca)
	in := start(t, env(nil), "--config", writeRules(t, policyRules), "--grpc-tls-cert", cert, "--grpc-tls-key", key, "--grpc-client-ca", ca)
	if err := handshake(in.grpcAddr, a.ClientTLS()); err != nil {
		t.Fatalf("before rotation: %v", err)
	}
	// Rename over: the server pair and the client CA of b.
	replace(t, b.ServerKey, key)
	replace(t, b.ServerCert, cert)
	replace(t, b.CA, ca)
	eventually(t, "rotated by rename", func() error { return handshake(in.grpcAddr, b.ClientTLS()) })
	if err := handshake(in.grpcAddr, a.ClientTLS()); err == nil {
		t.Error("the old CA and client certificate still work after the rotation")
	}
	// A broken pair keeps the one in force, and is counted.
	if err := os.WriteFile(cert, []byte("-----BEGIN CERTIFICATE-----\nnot base64\n-----END CERTIFICATE-----\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	eventually(t, "failed reload counted", func() error {
		if v := scrape(t, in.httpAddr, `ratelimitd_tls_reloads_total{identity="grpc",result="failure"}`); v == "" {
			return os.ErrNotExist
		}
		return nil
	})
	if err := handshake(in.grpcAddr, b.ClientTLS()); err != nil {
		t.Errorf("with a broken pair on disk, the pair in force stopped working: %v", err)
	}
	if !strings.Contains(in.log.String(), "keeping the certificates in force") {
		t.Error("the failed reload was not logged")
	}

	// A Secret volume: files are links into "..data", itself a link to a
	// timestamped directory that is swapped whole.
	vol := t.TempDir()
	populate := func(name string, certs *redistest.Certs) {
		d := filepath.Join(vol, name)
		if err := os.Mkdir(d, 0o700); err != nil {
			t.Fatal(err)
		}
		copyFile(t, certs.ServerCert, filepath.Join(d, "tls.crt"))
		copyFile(t, certs.ServerKey, filepath.Join(d, "tls.key"))
		copyFile(t, certs.CA, filepath.Join(d, "ca.crt"))
	}
	populate("..v1", b)
	if err := os.Symlink("..v1", filepath.Join(vol, "..data")); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"tls.crt", "tls.key", "ca.crt"} {
		if err := os.Symlink(filepath.Join("..data", f), filepath.Join(vol, f)); err != nil {
			t.Fatal(err)
		}
	}
	in2 := start(t, env(nil), "--config", writeRules(t, policyRules), "--grpc-tls-cert", filepath.Join(vol, "tls.crt"),
		"--grpc-tls-key", filepath.Join(vol, "tls.key"), "--grpc-client-ca", filepath.Join(vol, "ca.crt"))
	if err := handshake(in2.grpcAddr, b.ClientTLS()); err != nil {
		t.Fatalf("secret volume, before the swap: %v", err)
	}
	populate("..v2", c)
	if err := os.Symlink("..v2", filepath.Join(vol, "..data_tmp")); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(filepath.Join(vol, "..data_tmp"), filepath.Join(vol, "..data")); err != nil {
		t.Fatal(err)
	}
	eventually(t, "rotated by the ..data swap", func() error { return handshake(in2.grpcAddr, c.ClientTLS()) })
}

// TestRedisCertificateRotation starts the service with Redis TLS files
// that Redis refuses (a client pair from another CA) or that do not
// verify Redis (another CA): Redis cannot decide and the deny rule
// answers OVER_LIMIT by policy. Once the right files are renamed over the
// wrong ones, decisions come from Redis within 2 s, without a restart.
func TestRedisCertificateRotation(t *testing.T) {
	certs, other := redistest.NewCerts(t), redistest.NewCerts(t)
	srv := redistest.StartTLS(t, certs)
	dir := t.TempDir()
	cert, key, ca := filepath.Join(dir, "client.crt"), filepath.Join(dir, "client.key"), filepath.Join(dir, "ca.crt")
	copyFile(t, other.ClientCert, cert)
	copyFile(t, other.ClientKey, key)
	copyFile(t, other.CA, ca)
	in := start(t, env(nil), "--config", writeRules(t, policyRules), "--redis-url", "rediss://"+srv.Addr(),
		"--redis-tls-cert", cert, "--redis-tls-key", key, "--redis-tls-ca", ca)
	client := rlsv3.NewRateLimitServiceClient(dial(t, in.grpcAddr))
	login := func() (rlsv3.RateLimitResponse_Code, error) {
		r, err := client.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "res",
			Descriptors: []*rlcommon.RateLimitDescriptor{desc("login", "u")}})
		return r.GetOverallCode(), err
	}
	if code, err := login(); err != nil || code != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("with files Redis refuses: %v, %v; want OVER_LIMIT by the deny policy", code, err)
	}
	replace(t, certs.ClientKey, key)
	replace(t, certs.ClientCert, cert)
	replace(t, certs.CA, ca)
	eventually(t, "Redis deciding after the rotation", func() error {
		code, err := login()
		if err == nil && code != rlsv3.RateLimitResponse_OK {
			return os.ErrPermission
		}
		return err
	})
	if v, err := srv.Client().DBSize(context.Background()).Result(); err != nil || v == 0 {
		t.Errorf("no counter in Redis after the rotation: %d keys, %v", v, err)
	}
}
