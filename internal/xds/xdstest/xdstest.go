// Package xdstest runs a real xDS management server for tests: the
// server and snapshot cache of go-control-plane, as deployments of
// envoyproxy/ratelimit use them, on a port of its own.
package xdstest

import (
	"context"
	"net"
	"strconv"
	"sync"
	"testing"
	"time"

	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	cache "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	server "github.com/envoyproxy/go-control-plane/pkg/server/v3"
	rlsconf "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/grpc"
)

// Server is a management server holding one snapshot per node ID. It
// records the requests it receives, so tests can see ACKs and NACKs.
type Server struct {
	Addr  string
	Cache cache.SnapshotCache

	t      testing.TB
	mu     sync.Mutex
	reqs   []*discovery.DiscoveryRequest
	grpc   *grpc.Server
	done   chan struct{}
	cancel context.CancelFunc
}

// Start serves on addr ("127.0.0.1:0" for a free port) until Stop or the
// test's end, with opts (TLS credentials, say). Starting again on a
// stopped server's Addr stands for the management server restarting,
// with an empty cache.
func Start(t testing.TB, addr string, opts ...grpc.ServerOption) *Server {
	t.Helper()
	var lis net.Listener
	var err error
	// The port a stopped server left may take a moment to be free.
	for deadline := time.Now().Add(10 * time.Second); ; {
		if lis, err = net.Listen("tcp", addr); err == nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("xdstest: listen %s: %v", addr, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &Server{Addr: lis.Addr().String(), Cache: cache.NewSnapshotCache(true, cache.IDHash{}, nil),
		t: t, grpc: grpc.NewServer(opts...), done: make(chan struct{}), cancel: cancel}
	cb := server.CallbackFuncs{StreamRequestFunc: func(_ int64, r *discovery.DiscoveryRequest) error {
		s.mu.Lock()
		s.reqs = append(s.reqs, r)
		s.mu.Unlock()
		return nil
	}}
	discovery.RegisterAggregatedDiscoveryServiceServer(s.grpc, server.NewServer(ctx, s.Cache, cb))
	go func() {
		defer close(s.done)
		_ = s.grpc.Serve(lis)
	}()
	t.Cleanup(s.Stop)
	return s
}

// Stop closes every stream and the listener, and waits for them.
func (s *Server) Stop() {
	s.cancel()
	s.grpc.Stop()
	<-s.done
}

// Set makes configs, at version, the set node receives.
func (s *Server) Set(node, version string, configs ...*rlsconf.RateLimitConfig) {
	s.t.Helper()
	rs := make([]types.Resource, len(configs))
	for i, c := range configs {
		rs[i] = c
	}
	snap, err := cache.NewSnapshot(version, map[resource.Type][]types.Resource{resource.RateLimitConfigType: rs})
	if err != nil {
		s.t.Fatalf("xdstest: snapshot: %v", err)
	}
	if err := s.Cache.SetSnapshot(context.Background(), node, snap); err != nil {
		s.t.Fatalf("xdstest: set snapshot: %v", err)
	}
}

// Requests returns the requests received so far.
func (s *Server) Requests() []*discovery.DiscoveryRequest {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]*discovery.DiscoveryRequest(nil), s.reqs...)
}

// WaitFor waits up to timeout for a request that ok accepts, and returns
// it, or nil.
func (s *Server) WaitFor(timeout time.Duration, ok func(*discovery.DiscoveryRequest) bool) *discovery.DiscoveryRequest {
	for deadline := time.Now().Add(timeout); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		for _, r := range s.Requests() {
			if ok(r) {
				return r
			}
		}
	}
	return nil
}

// Limit is a one-level RateLimitConfig: domain, with key=value (value
// may be empty) limited to n per second.
func Limit(name, domain, key, value string, n uint32) *rlsconf.RateLimitConfig {
	return &rlsconf.RateLimitConfig{Name: name, Domain: domain, Descriptors: []*rlsconf.RateLimitDescriptor{{
		Key: key, Value: value,
		RateLimit: &rlsconf.RateLimitPolicy{Unit: rlsconf.RateLimitUnit_SECOND, RequestsPerUnit: n},
	}}}
}

// Version is a request's version as a number, -1 when it has none.
func Version(r *discovery.DiscoveryRequest) int {
	v, err := strconv.Atoi(r.GetVersionInfo())
	if err != nil {
		return -1
	}
	return v
}
