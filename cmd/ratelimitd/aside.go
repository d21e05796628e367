package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/ratelimitd/ratelimitd/internal/compatstats"
	"github.com/ratelimitd/ratelimitd/internal/memstore"
	"github.com/ratelimitd/ratelimitd/internal/metrics"
	"github.com/ratelimitd/ratelimitd/internal/persecond"
	"github.com/ratelimitd/ratelimitd/internal/redisstore"
	"github.com/ratelimitd/ratelimitd/internal/service"
	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/trace"
)

// newStore returns the Redis store for --redis-url (and
// --redis-persecond-url), or the embedded one. A URL that does not parse
// is an error; a Redis that does not answer yet is not: the service starts
// and uses it once it does.
func newStore(ctx context.Context, s *settings, tlsID *identity, tracer trace.Tracer, m *metrics.Metrics, log *slog.Logger) (service.Store, func(), error) {
	if s.redisURL == "" {
		log.Warn("no --redis-url: using the embedded in-memory store; limits are per process, not shared between instances")
		return memstore.New(memstore.Options{}), func() {}, nil
	}
	setRedisLogger(log)
	if s.redisURLInArgs && redisstore.Redact(s.redisURL) != s.redisURL {
		log.Warn("the Redis password is on the command line, where ps and /proc show it; give it with --redis-password-file or RATELIMITD_REDIS_URL instead")
	}
	opts, err := redisOptions(s, tlsID)
	if err != nil {
		return nil, nil, err
	}
	opts.Metrics, opts.Logger, opts.Tracer = m, log, tracer
	rs, err := openRedis(ctx, opts, "--redis-url", log)
	if err != nil {
		return nil, nil, err
	}
	if s.redisPerSecondURL == "" {
		return rs, func() { _ = rs.Close() }, nil
	}
	// The per-second Redis: the same mode, TLS files and timeouts; its
	// password is its URL's.
	opts.URL, opts.Password = s.redisPerSecondURL, ""
	fast, err := openRedis(ctx, opts, "--redis-persecond-url", log)
	if err != nil {
		_ = rs.Close()
		return nil, nil, err
	}
	return &persecond.Store{Main: rs, PerSecond: fast}, func() { _ = fast.Close(); _ = rs.Close() }, nil
}

// redisOptions are the store's options: the flags', the password (from
// --redis-password-file or the incumbent's REDIS_AUTH) and the TLS files.
func redisOptions(s *settings, tlsID *identity) (redisstore.Options, error) {
	opts := s.redis
	opts.Password = s.redisPassword
	if s.redisPassFile != "" {
		b, err := os.ReadFile(s.redisPassFile)
		if err != nil {
			return opts, fmt.Errorf("--redis-password-file: %w", err)
		}
		if opts.Password = strings.TrimRight(string(b), "\r\n"); opts.Password == "" {
			return opts, fmt.Errorf("--redis-password-file %s is empty", s.redisPassFile)
		}
	}
	if tlsID != nil && tlsID.certFile != "" {
		opts.ClientCert = tlsID.clientCert
	}
	if tlsID != nil && tlsID.caFile != "" {
		opts.RootCAs = tlsID.roots
	}
	return opts, nil
}

// openRedis opens one store, named by flag in errors and logs; one that
// does not answer yet is logged, not refused.
func openRedis(ctx context.Context, opts redisstore.Options, flag string, log *slog.Logger) (*redisstore.Store, error) {
	rs, err := redisstore.New(opts)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", flag, err)
	}
	if err := rs.Ping(ctx); err != nil {
		log.Warn("redis does not answer yet; answering by failure_mode until it does", "redis", flag, "mode", rs.Mode(), "err", err)
	} else {
		log.Info("redis ready", "redis", flag, "mode", rs.Mode())
	}
	return rs, nil
}

// redisLoggerOnce sets go-redis's logger, a global of that library (it
// has no per-client one), once for the process.
var redisLoggerOnce sync.Once

func setRedisLogger(log *slog.Logger) {
	redisLoggerOnce.Do(func() { redis.SetLogger(redisLogger{log}) })
}

// redisLogger sends go-redis's own log lines (one per failed dial, say)
// to debug: failures are counted and logged at a bounded rate elsewhere.
type redisLogger struct{ log *slog.Logger }

func (l redisLogger) Printf(ctx context.Context, format string, v ...any) {
	if l.log.Enabled(ctx, slog.LevelDebug) {
		l.log.DebugContext(ctx, fmt.Sprintf(format, v...), "component", "go-redis")
	}
}

// cmdline is pprof's /debug/pprof/cmdline without the secrets of a Redis
// URL given on the command line.
func cmdline(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	args := make([]string, len(os.Args))
	for i, a := range os.Args {
		args[i] = redisstore.Redact(a)
	}
	fmt.Fprint(w, strings.Join(args, "\x00"))
}

// startDebug serves pprof on addr until the returned stop is called.
func startDebug(addr string, log *slog.Logger) (stop func(), err error) {
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	return serveAside("--debug-addr", addr, mux, log)
}

// serveAside serves h on addr, a listener of its own beside the main
// ones, until the returned stop is called, which closes the server and
// waits for its goroutine. flag names addr in errors and logs.
func serveAside(flag, addr string, h http.Handler, log *slog.Logger) (stop func(), err error) {
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", flag, err)
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}
	var wg sync.WaitGroup
	wg.Go(func() {
		if err := srv.Serve(lis); err != nil && err != http.ErrServerClosed {
			log.Error("server stopped", "flag", flag, "err", err)
		}
	})
	log.Info("serving on "+flag, "addr", lis.Addr().String())
	return func() {
		_ = srv.Close()
		wg.Wait()
	}, nil
}

// newCompatStats makes the counters of envoyproxy/ratelimit's stats when
// a sink wants them (--statsd-addr, --compat-metrics-addr), else nil.
func newCompatStats(ctx context.Context, s *settings, getenv func(string) string, m *metrics.Metrics, log *slog.Logger) (*compatstats.Stats, error) {
	st := &s.stats
	if st.opts.StatsdAddr == "" && st.compatAddr == "" {
		return nil, nil
	}
	opts := st.opts
	opts.OnSinkError, opts.Logger, opts.Getenv = m.StatsSinkError, log, getenv
	if st.mapper != "" {
		b, err := os.ReadFile(st.mapper)
		if err != nil {
			return nil, fmt.Errorf("--compat-metrics-mapper: %w", err)
		}
		opts.Mapping = string(b)
	}
	c, err := compatstats.New(ctx, opts)
	switch {
	case err != nil && st.mapper != "":
		return nil, fmt.Errorf("--compat-metrics-mapper %s: %w", st.mapper, err)
	case errors.Is(err, compatstats.ErrAddress):
		return nil, fmt.Errorf("--statsd-addr: %w", err)
	case err != nil:
		return nil, err
	}
	if opts.StatsdAddr != "" {
		log.Info("sending envoyproxy/ratelimit's stats to statsd", "addr", opts.StatsdAddr, "protocol", opts.StatsdProtocol, "every", opts.FlushInterval)
	}
	return c, nil
}

// serveCompat serves envoyproxy/ratelimit's stats as Prometheus metrics on
// addr until the returned stop is called.
func serveCompat(addr, path string, c *compatstats.Stats, log *slog.Logger) (stop func(), err error) {
	mux := http.NewServeMux()
	mux.Handle(path, promhttp.HandlerFor(c.Registry(), promhttp.HandlerOpts{ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelError)}))
	return serveAside("--compat-metrics-addr", addr, mux, log)
}
