package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"os/signal"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/trace"

	"github.com/ratelimitd/ratelimitd/config"
	"github.com/ratelimitd/ratelimitd/internal/compatstats"
	"github.com/ratelimitd/ratelimitd/internal/filewatch"
	"github.com/ratelimitd/ratelimitd/internal/memstore"
	"github.com/ratelimitd/ratelimitd/internal/metrics"
	"github.com/ratelimitd/ratelimitd/internal/overlimitcache"
	"github.com/ratelimitd/ratelimitd/internal/persecond"
	"github.com/ratelimitd/ratelimitd/internal/redisstore"
	"github.com/ratelimitd/ratelimitd/internal/rlqs"
	"github.com/ratelimitd/ratelimitd/internal/server"
	"github.com/ratelimitd/ratelimitd/internal/service"
	"github.com/ratelimitd/ratelimitd/internal/tracing"
)

// The stores and the cache the service is wired with.
var (
	_ service.Store = (*redisstore.Store)(nil)
	_ service.Store = (*memstore.Store)(nil)
	_ service.Cache = (*overlimitcache.Cache)(nil)
	_ service.Store = (*persecond.Store)(nil)
)

// run starts the service with args and the environment behind getenv, and
// serves until ctx is done. Logs go to logOut.
func run(ctx context.Context, args []string, getenv func(string) string, logOut io.Writer) error {
	if len(args) > 0 {
		switch args[0] {
		case "check-config":
			return checkConfig(ctx, args[1:], logOut)
		case "healthcheck":
			return healthcheck(ctx, args[1:], logOut)
		case "explain":
			return explain(ctx, args[1:], logOut)
		case "diff":
			return diffRules(ctx, args[1:], logOut)
		}
	}
	s, err := parseSettings(args, getenv, logOut)
	if errors.Is(err, flag.ErrHelp) {
		return nil
	}
	if err != nil {
		return err
	}
	log := newLogger(s, logOut)
	log.Info("starting", "version", version, "go", runtime.Version())
	for _, v := range s.ignoredEnv {
		log.Warn("--env-compat: variable ignored", "variable", v)
	}

	m := metrics.New(version)
	compat, err := newCompatStats(ctx, s, getenv, m, log)
	if err != nil {
		return err
	}
	var flusher sync.WaitGroup
	flusher.Go(func() { compat.Run(ctx) })
	defer func() {
		compat.Close()
		flusher.Wait()
	}()
	loadOpts := config.Options{MergeDomains: s.mergeDomains}
	var rules *config.Snapshot
	if s.xds.server == "" {
		rules, err = config.LoadWith(ctx, loadOpts, s.config)
		if err != nil {
			compat.ConfigLoaded(false)
			return fmt.Errorf("rules: %w", err)
		}
		m.ConfigLoaded(true, rules.Hash, rules.LoadedAt)
		compat.ConfigLoaded(true)
		log.Info("rules loaded", "files", len(rules.Files), "domains", len(rules.Domains()), "hash", rules.Hash)
	} else if s.xds.beforeRules == "ok" {
		// No rules yet: an empty set answers every request OK.
		if rules, err = config.LoadDocs(ctx, loadOpts, nil); err != nil {
			return err
		}
	} // else nil: every request is refused as Unavailable until rules come.

	grpcID, err := newIdentity("grpc", "--grpc-tls-cert", "--grpc-client-ca", s.grpcTLSCert, s.grpcTLSKey, s.grpcClientCA)
	if err != nil {
		return err
	}
	redisID, err := newIdentity("redis", "--redis-tls-cert", "--redis-tls-ca", s.redisTLSCert, s.redisTLSKey, s.redisTLSCA)
	if err != nil {
		return err
	}
	xdsID, err := newIdentity("xds", "--xds-tls-cert", "--xds-tls-ca", s.xds.cert, s.xds.key, s.xds.ca)
	if err != nil {
		return err
	}
	traces, err := newTracing(ctx, s, m, log)
	if err != nil {
		return err
	}
	defer func() {
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := traces.Shutdown(sctx); err != nil {
			log.Warn("tracing: spans still queued at shutdown were dropped", "err", err)
		}
	}()
	store, closeStore, err := newStore(ctx, s, redisID, traces.Tracer(), m, log)
	if err != nil {
		return err
	}
	defer closeStore()

	var cache service.Cache
	if s.localCacheSize > 0 {
		cache = overlimitcache.New(int(s.localCacheSize))
	}
	svc := service.New(rules, store, cache, service.Options{
		KeyPrefix:        s.keyPrefix,
		ShadowMode:       s.shadowMode,
		ResponseHeaders:  service.HeaderStyle(s.responseHeaders),
		HeaderNames:      s.headerNames,
		FailureMode:      s.failureMode,
		RejectedHits:     s.rejectedHits,
		UsageTimeout:     s.usageTimeout,
		CalendarPeriods:  s.calendarPeriods,
		DecisionMetadata: s.decisionMeta,
		NearLimitRatio:   s.nearLimitRatio,
		Metrics:          m,
		Compat:           compat,
		Logger:           log,
	})

	// Listen before serving so that a port in use is a startup error.
	// net.Listen never sets SO_REUSEPORT: a second instance cannot
	// silently take part of this one's traffic.
	grpcLis, err := net.Listen("tcp", s.grpcAddr)
	if err != nil {
		return fmt.Errorf("--grpc-addr: %w", err)
	}
	httpLis, err := net.Listen("tcp", s.httpAddr)
	if err != nil {
		grpcLis.Close()
		return fmt.Errorf("--http-addr: %w", err)
	}

	reloadCtx, stopReload := context.WithCancel(ctx)
	var reloaders sync.WaitGroup
	defer reloaders.Wait()
	defer stopReload()
	apply := func(rules *config.Snapshot, err error) {
		m.ConfigLoaded(err == nil, rules.GetHash(), time.Now())
		compat.ConfigLoaded(err == nil)
		if err != nil {
			log.Error("rules reload failed; keeping the rules in force", "err", err, "hash", svc.Rules().GetHash())
			return
		}
		svc.SetRules(rules)
		log.Info("rules reloaded", "files", len(rules.Files), "domains", len(rules.Domains()), "hash", rules.Hash)
	}
	var ids []*identity
	for _, id := range []*identity{grpcID, redisID, xdsID} {
		if id != nil {
			ids = append(ids, id)
		}
	}
	reloadTLS := func(id *identity) {
		if err := id.reload(); err != nil {
			m.TLSReloaded(id.name, false)
			log.Error("TLS files reload failed; keeping the certificates in force", "identity", id.name, "err", err)
			return
		}
		m.TLSReloaded(id.name, true)
		log.Info("TLS files reloaded; new connections use them", "identity", id.name)
	}
	reloaders.Go(func() {
		onHUP(reloadCtx, func() {
			if s.xds.server == "" {
				apply(config.LoadWith(reloadCtx, loadOpts, s.config))
			}
			for _, id := range ids {
				reloadTLS(id)
			}
		})
	})
	if s.xds.server != "" {
		if err := startXDS(reloadCtx, &reloaders, &s.xds, xdsID, loadOpts, m, log, apply); err != nil {
			grpcLis.Close()
			httpLis.Close()
			return err
		}
	} else if s.watch {
		reloaders.Go(func() {
			if err := config.Watch(reloadCtx, []string{s.config}, loadOpts, 0, rules.Hash, apply); err != nil {
				log.Error("cannot watch the rules; reload with SIGHUP", "err", err)
			}
		})
	}
	// Certificates are watched whatever --watch says: cert-manager and
	// kubelet replace them under a running server.
	for _, id := range ids {
		reloaders.Go(func() {
			err := filewatch.Watch(reloadCtx, id.files(), 0, func() { reloadTLS(id) },
				func(err error) { log.Error("TLS files watch", "identity", id.name, "err", err) })
			if err != nil {
				log.Error("cannot watch the TLS files; reload with SIGHUP", "identity", id.name, "err", err)
			}
		})
	}

	grpcOpts := grpcServerOptions(s, grpcID)
	if s.stats.compatAddr != "" {
		stopCompat, err := serveCompat(s.stats.compatAddr, s.stats.compatPath, compat, log)
		if err != nil {
			grpcLis.Close()
			httpLis.Close()
			return err
		}
		defer stopCompat()
	}
	if s.debugAddr != "" {
		stopDebug, err := startDebug(s.debugAddr, log)
		if err != nil {
			grpcLis.Close()
			httpLis.Close()
			return err
		}
		defer stopDebug()
	}
	var streams []server.StreamService
	if s.rlqs.on {
		g, ok := store.(rlqs.Granter)
		if !ok {
			grpcLis.Close()
			httpLis.Close()
			return fmt.Errorf("--rlqs: the store %T cannot grant", store)
		}
		streams = append(streams, rlqs.New(svc, g, rlqs.Options{MaxStreams: s.rlqs.maxStreams, MaxBuckets: s.rlqs.maxBuckets,
			Margin: s.rlqs.margin, IdleAfter: s.rlqs.idleAfter, Metrics: m, Logger: log}))
		log.Info("serving RLQS (preview): envoy.service.rate_limit_quota.v3 on the gRPC port", "margin", s.rlqs.margin)
	}
	srv := server.New(svc, server.Options{
		GRPCOptions: grpcOpts,
		Logger:      log,
		DrainDelay:  s.drainDelay,
		Tracing:     traces,
		Streams:     streams,
		Metrics:     promhttp.HandlerFor(m.Registry, promhttp.HandlerOpts{ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelError)}),
	})
	return srv.Serve(ctx, grpcLis, httpLis)
}

func newLogger(s *settings, out io.Writer) *slog.Logger {
	opts := &slog.HandlerOptions{Level: s.logLevel}
	if s.logFormat == "json" {
		return slog.New(slog.NewJSONHandler(out, opts))
	}
	return slog.New(slog.NewTextHandler(out, opts))
}

// newStore returns the Redis store for --redis-url, or the embedded one.
// A URL that does not parse is an error; a Redis that does not answer yet
// is not: the service starts and uses it once it does.
func newStore(ctx context.Context, s *settings, tlsID *identity, tracer trace.Tracer, m *metrics.Metrics, log *slog.Logger) (service.Store, func(), error) {
	if s.redisURL == "" {
		log.Warn("no --redis-url: using the embedded in-memory store; limits are per process, not shared between instances")
		return memstore.New(memstore.Options{}), func() {}, nil
	}
	redis.SetLogger(redisLogger{log})
	password := s.redisPassword
	if s.redisPassFile != "" {
		b, err := os.ReadFile(s.redisPassFile)
		if err != nil {
			return nil, nil, fmt.Errorf("--redis-password-file: %w", err)
		}
		password = strings.TrimRight(string(b), "\r\n")
		if password == "" {
			return nil, nil, fmt.Errorf("--redis-password-file %s is empty", s.redisPassFile)
		}
	}
	if s.redisURLInArgs && redisstore.Redact(s.redisURL) != s.redisURL {
		log.Warn("the Redis password is on the command line, where ps and /proc show it; give it with --redis-password-file or RATELIMITD_REDIS_URL instead")
	}
	opts := redisstore.Options{
		URL: s.redisURL, Password: password, Mode: s.redisMode, Timeout: s.redisTimeout, BreakerOpenAfter: s.breakerAfter,
		Metrics: m, Logger: log, Dispatchers: s.dispatchers, LeaseInterval: s.leaseInterval, Tracer: tracer,
	}
	if tlsID != nil && tlsID.certFile != "" {
		opts.ClientCert = tlsID.clientCert
	}
	if tlsID != nil && tlsID.caFile != "" {
		opts.RootCAs = tlsID.roots
	}
	rs, err := redisstore.New(opts)
	if err != nil {
		return nil, nil, fmt.Errorf("--redis-url: %w", err)
	}
	if err := rs.Ping(ctx); err != nil {
		log.Warn("redis does not answer yet; answering by failure_mode until it does", "mode", rs.Mode(), "err", err)
	} else {
		log.Info("redis ready", "mode", rs.Mode())
	}
	if s.redisPerSecondURL == "" {
		return rs, func() { _ = rs.Close() }, nil
	}
	// The per-second Redis: the same mode, TLS files and timeouts; its
	// password is its URL's.
	opts.URL, opts.Password = s.redisPerSecondURL, ""
	fast, err := redisstore.New(opts)
	if err != nil {
		_ = rs.Close()
		return nil, nil, fmt.Errorf("--redis-persecond-url: %w", err)
	}
	if err := fast.Ping(ctx); err != nil {
		log.Warn("per-second redis does not answer yet; answering by failure_mode until it does", "err", err)
	} else {
		log.Info("per-second redis ready: counters of one-second windows live there")
	}
	return &persecond.Store{Main: rs, PerSecond: fast}, func() { _ = fast.Close(); _ = rs.Close() }, nil
}

// onHUP calls reload on each SIGHUP until ctx is done.
func onHUP(ctx context.Context, reload func()) {
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	for {
		select {
		case <-ctx.Done():
			return
		case <-hup:
		}
		reload()
	}
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
	if st.statsdAddr == "" && st.compatAddr == "" {
		return nil, nil
	}
	tags, _ := parsePairs(st.tags) // checked with the flags
	opts := compatstats.Options{
		StatsdAddr: st.statsdAddr, StatsdProtocol: st.statsdProtocol, DogStatsd: st.dogstatsd, Mogrifiers: st.mogrifiers,
		Tags: tags, FlushInterval: st.flushInterval,
		Prometheus: st.compatAddr != "", NearLimitRatio: s.nearLimitRatio, OnSinkError: m.StatsSinkError, Logger: log, Getenv: getenv,
	}
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
	if st.statsdAddr != "" {
		log.Info("sending envoyproxy/ratelimit's stats to statsd", "addr", st.statsdAddr, "protocol", st.statsdProtocol, "every", st.flushInterval)
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

// newTracing starts the trace pipeline when --tracing-endpoint is set,
// else returns nil (tracing off, and no cost on the request path).
func newTracing(ctx context.Context, s *settings, m *metrics.Metrics, log *slog.Logger) (*tracing.Tracing, error) {
	t := &s.tracing
	if t.endpoint == "" {
		return nil, nil
	}
	tr, err := tracing.New(ctx, tracing.Options{
		Endpoint: t.endpoint, Protocol: t.protocol, SamplingRate: t.samplingRate,
		ServiceName: t.serviceName, ServiceNamespace: t.namespace, InstanceID: t.instanceID, Version: version,
		OnDrop: m.SpansLost, Logger: log,
	})
	if err != nil {
		return nil, fmt.Errorf("--tracing-endpoint: %w", err)
	}
	log.Info("exporting traces", "endpoint", t.endpoint, "protocol", t.protocol, "sampling_rate", t.samplingRate)
	return tr, nil
}
