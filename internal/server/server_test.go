package server

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/ratelimitd/ratelimitd/config"
	"github.com/ratelimitd/ratelimitd/internal/memstore"
	"github.com/ratelimitd/ratelimitd/internal/service"
)

func newService(t testing.TB) *service.Service {
	t.Helper()
	snap, err := config.Parse("r.yaml", []byte("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 1}\n"))
	if err != nil {
		t.Fatal(err)
	}
	return service.New(snap, memstore.New(memstore.Options{}), nil, service.Options{})
}

func TestJSON(t *testing.T) {
	srv := New(newService(t), Options{})
	t.Cleanup(srv.grpc.Stop) // never served: its stream workers still run
	h := srv.httpHandler()
	tests := []struct {
		name       string
		method     string
		path       string
		body       string
		wantStatus int
		wantBody   string
	}{
		{"ok", "POST", "/json", `{"domain":"d","descriptors":[{"entries":[{"key":"k","value":"v"}]}]}`, 200, `"overallCode":"OK"`},
		{"over", "POST", "/json", `{"domain":"d","descriptors":[{"entries":[{"key":"k","value":"v"}]}]}`, 429, `"overallCode":"OVER_LIMIT"`},
		{"no match", "POST", "/json", `{"domain":"d","descriptors":[{"entries":[{"key":"x","value":"v"}]}]}`, 200, `"statuses":[{"code":"OK"}]`},
		{"malformed", "POST", "/json", `{"domain":`, 400, "invalid RateLimitRequest JSON"},
		{"unknown field", "POST", "/json", `{"domian":"d"}`, 400, `unknown field "domian"`},
		{"invalid", "POST", "/json", `{"domain":"d"}`, 400, "invalid request: descriptors must not be empty"},
		{"too big", "POST", "/json", `{"domain":"` + strings.Repeat("x", MaxJSONBody) + `"}`, 413, "over the 1048576 bytes (1 MiB) a /json request may have"},
		{"get json", "GET", "/json", ``, 405, ""},
		{"health", "GET", "/healthcheck", ``, 200, "OK"},
		{"rules", "GET", "/rlconfig", ``, 200, "d.k: unit=hour requests_per_unit=1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, httptest.NewRequest(tt.method, tt.path, strings.NewReader(tt.body)))
			if rec.Code != tt.wantStatus || !strings.Contains(rec.Body.String(), tt.wantBody) {
				t.Errorf("%s %s = %d %q, want %d containing %q", tt.method, tt.path, rec.Code, rec.Body.String(), tt.wantStatus, tt.wantBody)
			}
		})
	}
}

func TestGRPCErrorCodes(t *testing.T) {
	tests := []struct {
		give error
		want codes.Code
	}{
		{service.ErrInvalidRequest, codes.InvalidArgument},
		{service.ErrNoRules, codes.Unavailable},
		{context.DeadlineExceeded, codes.DeadlineExceeded},
		{errors.New("boom"), codes.Internal},
	}
	for _, tt := range tests {
		if got := status.Code(grpcError(tt.give)); got != tt.want {
			t.Errorf("grpcError(%v) = %v, want %v", tt.give, got, tt.want)
		}
	}
}

// slowDecider holds every decision until release is closed.
type slowDecider struct {
	*service.Service
	entered chan struct{}
	release chan struct{}
}

func (s *slowDecider) ShouldRateLimit(ctx context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	s.entered <- struct{}{}
	<-s.release
	return s.Service.ShouldRateLimit(ctx, req)
}

// TestShutdownDrains checks the order: health goes NOT_SERVING first, on
// HTTP (503) and on gRPC for every service name load balancers ask about,
// in-flight requests finish, then the listeners close.
func TestShutdownDrains(t *testing.T) {
	dec := &slowDecider{Service: newService(t), entered: make(chan struct{}, 1), release: make(chan struct{})}
	srv := New(dec, Options{DrainDelay: time.Second})
	gl, _ := net.Listen("tcp", "127.0.0.1:0")
	hl, _ := net.Listen("tcp", "127.0.0.1:0")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx, gl, hl) }()
	cc, err := grpc.NewClient(gl.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	hc := healthpb.NewHealthClient(cc)
	grpcHealth := func() []string {
		var got []string
		for _, name := range HealthServices {
			r, err := hc.Check(context.Background(), &healthpb.HealthCheckRequest{Service: name})
			got = append(got, fmt.Sprint(r.GetStatus(), err))
		}
		return got
	}
	for _, st := range grpcHealth() {
		if st != "SERVING <nil>" {
			t.Fatalf("gRPC health before shutdown: %v", st)
		}
	}
	base := "http://" + hl.Addr().String()
	inflight := make(chan int, 1)
	go func() {
		resp, err := http.Post(base+"/json", "application/json",
			strings.NewReader(`{"domain":"d","descriptors":[{"entries":[{"key":"k","value":"v"}]}]}`))
		if err != nil {
			inflight <- -1
			return
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		inflight <- resp.StatusCode
	}()
	<-dec.entered
	cancel()
	// The request held in flight keeps the server draining until release.
	deadline := time.Now().Add(5 * time.Second)
	for {
		resp, err := http.Get(base + "/healthcheck")
		if err != nil {
			t.Fatalf("healthcheck during drain: %v", err)
		}
		resp.Body.Close()
		if resp.StatusCode == http.StatusServiceUnavailable {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("healthcheck during drain = %d, want 503", resp.StatusCode)
		}
		time.Sleep(5 * time.Millisecond)
	}
	for i, st := range grpcHealth() {
		if st != "NOT_SERVING <nil>" {
			t.Errorf("gRPC health %q during drain: %v, want NOT_SERVING", HealthServices[i], st)
		}
	}
	close(dec.release)
	if code := <-inflight; code != http.StatusOK {
		t.Errorf("in-flight request = %d, want 200", code)
	}
	if err := <-done; err != nil {
		t.Errorf("Serve = %v", err)
	}
}
