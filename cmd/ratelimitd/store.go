package main

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/trace"

	"github.com/ratelimitd/ratelimitd/internal/global"
	"github.com/ratelimitd/ratelimitd/internal/lease"
	"github.com/ratelimitd/ratelimitd/internal/memstore"
	"github.com/ratelimitd/ratelimitd/internal/persecond"
	"github.com/ratelimitd/ratelimitd/internal/redisstore"
	"github.com/ratelimitd/ratelimitd/internal/service"
)

// newStore returns the Redis store for --redis-url (and
// --redis-persecond-url), or the embedded one. A URL that does not parse
// is an error; a Redis that does not answer yet is not: the service starts
// and uses it once it does.
func newStore(ctx context.Context, s *settings, tlsID *identity, tracer trace.Tracer, m *allMetrics, log *slog.Logger) (service.Store, func(), error) {
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
	opts.Metrics, opts.Logger, opts.Tracer = m.store, log, tracer
	rs, err := openRedis(ctx, opts, "--redis-url", log)
	if err != nil {
		return nil, nil, err
	}
	// Leased counters are decided from grants in process, the rest in
	// Redis: each Redis store gets its leases.
	lopts := s.lease
	lopts.Metrics, lopts.Timeout = m.lease, cmp.Or(opts.Timeout, redisstore.DefaultTimeout)
	main := lease.New(rs, lopts)
	if s.redisPerSecondURL == "" {
		return withGlobal(ctx, s, opts, m, log, main, func() { _ = main.Close(); _ = rs.Close() })
	}
	// The per-second Redis: the same mode, TLS files and timeouts; its
	// password is its URL's.
	opts.URL, opts.Password = s.redisPerSecondURL, ""
	fast, err := openRedis(ctx, opts, "--redis-persecond-url", log)
	if err != nil {
		_ = main.Close()
		_ = rs.Close()
		return nil, nil, err
	}
	fastLeased := lease.New(fast, lopts)
	return withGlobal(ctx, s, opts, m, log, &persecond.Store{Main: main, PerSecond: fastLeased}, func() {
		_ = fastLeased.Close()
		_ = main.Close()
		_ = fast.Close()
		_ = rs.Close()
	})
}

// withGlobal wraps the region's store with global limits drawn from
// --global-redis-url, when it is set: the home Redis is reached with the
// region's mode, TLS files and password rules, its password its URL's.
func withGlobal(ctx context.Context, s *settings, opts redisstore.Options, m *allMetrics, log *slog.Logger, local service.Store, closeLocal func()) (service.Store, func(), error) {
	if s.globalURL == "" {
		return local, closeLocal, nil
	}
	opts.URL, opts.Password, opts.Mode = s.globalURL, "", ""
	opts.Timeout = global.DefaultHomeTimeout
	opts.ChargeJournal, opts.ChargeJournalAuto, opts.CarryIncumbent, opts.GrantsOnly = false, false, false, true
	home, err := openRedis(ctx, opts, "--global-redis-url", log)
	if err != nil {
		closeLocal()
		return nil, nil, err
	}
	gopts := s.global
	gopts.Metrics, gopts.Logger = m.global, log
	g := global.New(local, home, gopts)
	log.Info("global limits drawn from the home Redis", "url", redisstore.Redact(s.globalURL), "refresh", gopts.Refresh, "partition", s.globalPolicy,
		"global_domains", s.globalDomains)
	return g, func() { _ = g.Close(); _ = home.Close(); closeLocal() }, nil
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
	// Every line of the store names the Redis it is about.
	opts.Logger = log.With("redis", flag)
	rs, err := redisstore.New(opts)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", flag, err)
	}
	start := time.Now()
	switch err := rs.Ping(ctx); {
	case err != nil && flag == "--global-redis-url":
		log.Warn("the home Redis does not answer yet; global checks beyond what is held follow --global-partition until it does", "redis", flag, "mode", rs.Mode(), "err", err)
		rs.SayWhenAnswering(start)
	case err != nil:
		log.Warn("redis does not answer yet; answering by failure_mode until it does", "redis", flag, "mode", rs.Mode(), "err", err)
		rs.SayWhenAnswering(start)
	default:
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
