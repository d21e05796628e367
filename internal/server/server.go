// Package server carries the rate-limit service over gRPC
// (envoy.service.ratelimit.v3.RateLimitService, grpc.health.v1 and server
// reflection) and HTTP (/json, /healthcheck, /rlconfig), and owns their
// lifecycle: start, serve, drain, stop.
package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	otelcodes "go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/reflection"
	"google.golang.org/grpc/status"

	"github.com/ratelimitd/ratelimitd/config"
	"github.com/ratelimitd/ratelimitd/internal/service"
	"github.com/ratelimitd/ratelimitd/internal/tracing"
)

// Decider is what the transports need of the service.
type Decider interface {
	ShouldRateLimit(ctx context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error)
	Rules() *config.Snapshot
}

// HealthServices are the gRPC health service names answered: the overall
// server (""), the RLS service's full name, and "ratelimit", the name
// envoyproxy/ratelimit's health checks use.
var HealthServices = []string{"", rlsv3.RateLimitService_ServiceDesc.ServiceName, "ratelimit"}

// DefaultShutdownTimeout bounds the graceful stop when
// [Options.ShutdownTimeout] is zero.
const DefaultShutdownTimeout = 10 * time.Second

// Options configures a [Server].
type Options struct {
	// Logger receives lifecycle lines. Nil discards.
	Logger *slog.Logger
	// DrainDelay is how long the server keeps serving, while health
	// answers NOT_SERVING, before it stops accepting: time for load
	// balancers to notice. Zero means no delay.
	DrainDelay time.Duration
	// ShutdownTimeout bounds the wait for in-flight calls once draining
	// ends; calls still running then are cut. Zero means
	// DefaultShutdownTimeout.
	ShutdownTimeout time.Duration
	// Metrics, when set, is served on /metrics.
	Metrics http.Handler
	// GRPCOptions are added to the gRPC server's options (TLS, message
	// sizes, keepalive).
	GRPCOptions []grpc.ServerOption
	// Tracing, when set, starts a span per ShouldRateLimit call (gRPC and
	// /json), child of the trace context the caller sent.
	Tracing *tracing.Tracing
	// Streams, when set, are more gRPC services of long-lived streams
	// (RLQS): registered on the gRPC server, and stopped once draining
	// ends, so that the graceful stop does not wait for streams that
	// never end on their own.
	Streams []StreamService
}

// StreamService is a gRPC service of long-lived streams.
type StreamService interface {
	Register(grpc.ServiceRegistrar)
	// Stop ends its streams.
	Stop()
}

// StreamWorkers is the number of goroutines kept to run RPCs. A stream
// beyond them gets a goroutine of its own, as without workers.
const StreamWorkers = 128

// TransportOptions are the gRPC server options for the hot path, which
// the load tool's no-op server uses too, so that the two compare on equal
// terms. Stream workers: a new goroutine per RPC starts with a small stack
// and grows it on every call (runtime.newstack was 9 % of the service's
// CPU under open-loop load); a kept worker has grown it once.
func TransportOptions() []grpc.ServerOption {
	return []grpc.ServerOption{grpc.NumStreamWorkers(StreamWorkers)}
}

// Server serves one [Decider] over gRPC and HTTP.
type Server struct {
	dec    Decider
	opts   Options
	log    *slog.Logger
	grpc   *grpc.Server
	health *health.Server
	http   *http.Server

	mu       sync.Mutex
	draining bool
}

// New builds the servers; nothing listens until [Server.Serve].
func New(dec Decider, opts Options) *Server {
	s := &Server{dec: dec, opts: opts, log: opts.Logger, health: health.NewServer()}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	if s.opts.ShutdownTimeout <= 0 {
		s.opts.ShutdownTimeout = DefaultShutdownTimeout
	}
	// The codec (a request decoder of its own, the generated response
	// encoder) is ratelimitd's, not a transport option: the load tool's no-op server
	// keeps protobuf-go's.
	s.grpc = grpc.NewServer(append(append(TransportOptions(), codecOption()), opts.GRPCOptions...)...)
	rlsv3.RegisterRateLimitServiceServer(s.grpc, &rls{dec: dec, tracing: opts.Tracing})
	for _, st := range opts.Streams {
		st.Register(s.grpc)
	}
	healthpb.RegisterHealthServer(s.grpc, s.health)
	reflection.Register(s.grpc)
	s.http = &http.Server{
		Handler:           s.httpHandler(),
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       30 * time.Second,
		IdleTimeout:       2 * time.Minute,
	}
	return s
}

// Serve serves on the two listeners until ctx is done or one of them
// fails, then shuts down as [Server.Shutdown] describes. It returns nil
// after a shutdown caused by ctx.
func (s *Server) Serve(ctx context.Context, grpcLis, httpLis net.Listener) error {
	for _, name := range HealthServices {
		s.health.SetServingStatus(name, healthpb.HealthCheckResponse_SERVING)
	}
	errc := make(chan error, 2) // one slot per serving goroutine, so neither blocks on exit
	var wg sync.WaitGroup
	wg.Go(func() {
		if err := s.grpc.Serve(grpcLis); err != nil {
			errc <- fmt.Errorf("grpc: %w", err)
		}
	})
	wg.Go(func() {
		if err := s.http.Serve(httpLis); err != nil && !errors.Is(err, http.ErrServerClosed) {
			errc <- fmt.Errorf("http: %w", err)
		}
	})
	s.log.Info("serving", "grpc_addr", grpcLis.Addr().String(), "http_addr", httpLis.Addr().String())
	var err error
	select {
	case <-ctx.Done():
	case err = <-errc:
	}
	s.Shutdown()
	wg.Wait()
	return err
}

// Shutdown stops serving in this order: gRPC health and /healthcheck
// report NOT_SERVING; the server keeps answering for DrainDelay; then
// gRPC stops gracefully and HTTP shuts down, both waiting for in-flight
// calls up to ShutdownTimeout, after which remaining calls are cut. The
// store is the caller's to close, after Shutdown returns. It is safe to
// call more than once.
func (s *Server) Shutdown() {
	s.mu.Lock()
	if s.draining {
		s.mu.Unlock()
		return
	}
	s.draining = true
	s.mu.Unlock()
	s.health.Shutdown()
	if s.opts.DrainDelay > 0 {
		s.log.Info("draining", "delay", s.opts.DrainDelay)
		time.Sleep(s.opts.DrainDelay)
	}
	for _, st := range s.opts.Streams {
		st.Stop()
	}
	ctx, cancel := context.WithTimeout(context.Background(), s.opts.ShutdownTimeout)
	defer cancel()
	stopped := make(chan struct{})
	go func() {
		s.grpc.GracefulStop()
		close(stopped)
	}()
	if err := s.http.Shutdown(ctx); err != nil {
		s.log.Warn("http shutdown cut in-flight requests", "err", err)
		_ = s.http.Close()
	}
	select {
	case <-stopped:
	case <-ctx.Done():
		s.log.Warn("grpc graceful stop timed out; cutting in-flight calls", "timeout", s.opts.ShutdownTimeout)
		s.grpc.Stop()
		<-stopped
	}
	s.log.Info("serving stopped")
}

func (s *Server) serving() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return !s.draining
}

// rls adapts the Decider to the generated gRPC service.
type rls struct {
	rlsv3.UnimplementedRateLimitServiceServer
	dec     Decider
	tracing *tracing.Tracing
}

// shouldRateLimitSpan is the span name of a gRPC call, as OpenTelemetry's
// gRPC instrumentation names it.
const shouldRateLimitSpan = "envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"

func (r *rls) ShouldRateLimit(ctx context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	if r.tracing != nil {
		md, _ := metadata.FromIncomingContext(ctx)
		var span trace.Span
		ctx, span = r.tracing.Start(ctx, shouldRateLimitSpan, mdCarrier(md))
		defer span.End()
		resp, err := r.dec.ShouldRateLimit(ctx, req)
		if err != nil {
			err = grpcError(err)
			span.SetStatus(otelcodes.Error, err.Error())
			return nil, err
		}
		return resp, nil
	}
	resp, err := r.dec.ShouldRateLimit(ctx, req)
	if err != nil {
		return nil, grpcError(err)
	}
	return resp, nil
}

// mdCarrier reads trace context from gRPC metadata, whose keys are
// lower-case as the propagators ask for them.
type mdCarrier metadata.MD

func (c mdCarrier) Get(key string) string {
	if v := metadata.MD(c).Get(key); len(v) > 0 {
		return v[0]
	}
	return ""
}

func (c mdCarrier) Set(key, value string) { metadata.MD(c).Set(key, value) }

func (c mdCarrier) Keys() []string {
	keys := make([]string, 0, len(c))
	for k := range c {
		keys = append(keys, k)
	}
	return keys
}

// grpcError gives each service error its gRPC code: a bad request is the
// caller's to fix (InvalidArgument), missing rules are ours (Unavailable),
// never the incumbent's catch-all Unknown.
func grpcError(err error) error {
	switch {
	case errors.Is(err, service.ErrInvalidRequest):
		return status.Error(codes.InvalidArgument, err.Error())
	case errors.Is(err, service.ErrNoRules):
		return status.Error(codes.Unavailable, err.Error())
	case errors.Is(err, context.DeadlineExceeded):
		return status.Error(codes.DeadlineExceeded, err.Error())
	case errors.Is(err, context.Canceled):
		return status.Error(codes.Canceled, err.Error())
	}
	return status.Error(codes.Internal, err.Error())
}
