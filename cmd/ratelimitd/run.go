package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"runtime"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/ratelimitd/ratelimitd/config"
	"github.com/ratelimitd/ratelimitd/internal/filewatch"
	"github.com/ratelimitd/ratelimitd/internal/incumbentstats"
	"github.com/ratelimitd/ratelimitd/internal/memstore"
	"github.com/ratelimitd/ratelimitd/internal/metrics"
	"github.com/ratelimitd/ratelimitd/internal/overlimitcache"
	"github.com/ratelimitd/ratelimitd/internal/persecond"
	"github.com/ratelimitd/ratelimitd/internal/record"
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

// run runs a command, or starts the service with args and the
// environment behind getenv and serves until ctx is done. Results (a
// command's, the usage asked for, the version) go to stdout; logs to
// logOut.
func run(ctx context.Context, args []string, getenv func(string) string, stdout, logOut io.Writer) error {
	if len(args) > 0 {
		switch args[0] {
		case "check-config":
			return checkConfig(ctx, args[1:], stdout, logOut)
		case "healthcheck":
			return healthcheck(ctx, args[1:], stdout)
		case "explain":
			return explain(ctx, args[1:], stdout)
		case "diff":
			return diffRules(ctx, args[1:], stdout)
		case "version":
			fmt.Fprintln(stdout, versionLine())
			return nil
		}
	}
	if wantsVersion(args) {
		fmt.Fprintln(stdout, versionLine())
		return nil
	}
	s, err := parseSettings(args, getenv, stdout)
	if errors.Is(err, flag.ErrHelp) {
		return nil
	}
	if err != nil {
		return err
	}
	a := &app{s: s, getenv: getenv, log: newLogger(s, logOut), m: newMetrics(version)}
	defer func() {
		if a.served {
			// The last line: the stores have closed (the charge journal
			// handed over or said what it could not).
			a.log.Info("stopped")
		}
	}()
	defer a.cleanup()
	a.log.Info("starting", "version", version, "go", runtime.Version())
	for _, v := range s.unknownEnv {
		a.log.Warn("variable ignored: no flag of that name (RATELIMITD_ and the flag's name, upper case, - as _)", "variable", v)
	}
	for _, v := range s.ignoredEnv {
		a.log.Warn("--env-compat: variable ignored", "variable", v)
	}
	for _, arg := range s.ignoredArgs {
		a.log.Warn("--env-compat: argument ignored, as envoyproxy/ratelimit ignores every argument (not a ratelimitd flag)",
			"argument", redisstore.Redact(arg))
	}
	for _, start := range []func(context.Context) error{a.startStats, a.loadRules, a.loadIdentities, a.startTracing,
		a.openStore, a.newService, a.startReloads, a.startAside, a.startRLQS} {
		if err := start(ctx); err != nil {
			return a.fatal(err)
		}
	}
	return a.fatal(a.serve(ctx))
}

// fatal is err, which ends the process: under --log-format json a log
// line of its own, so that the log stays JSON to its end.
func (a *app) fatal(err error) error {
	if err == nil || a.s.logFormat != "json" {
		return err
	}
	a.log.Error("fatal", "err", err)
	return &exitError{code: 1, err: err, logged: true}
}

// app is the process being assembled: each start step adds a component
// and pushes what undoes it on one cleanup stack, run in reverse when run
// returns, whichever step failed.
type app struct {
	s      *settings
	getenv func(string) string
	log    *slog.Logger
	m      *allMetrics
	undo   []func()
	served bool // serve was reached: "stopped" ends the log

	incumbent *incumbentstats.Stats
	rules     *config.Snapshot
	loadOps   config.Options
	ids       []*identity // those set, for reloads
	grpcID    *identity
	redisID   *identity
	xdsID     *identity
	traces    *tracing.Tracing
	store     service.Store
	svc       *service.Service
	streams   []server.StreamService
}

func (a *app) onExit(f func()) { a.undo = append(a.undo, f) }

func (a *app) cleanup() {
	for i := len(a.undo) - 1; i >= 0; i-- {
		a.undo[i]()
	}
}

func newLogger(s *settings, out io.Writer) *slog.Logger {
	opts := &slog.HandlerOptions{Level: s.logLevel}
	if s.logFormat == "json" {
		return slog.New(slog.NewJSONHandler(out, opts))
	}
	return slog.New(slog.NewTextHandler(out, opts))
}

// startStats starts envoyproxy/ratelimit's stats when a sink wants them.
func (a *app) startStats(ctx context.Context) error {
	c, err := newIncumbentStats(ctx, a.s, a.getenv, a.m.Metrics, a.log)
	if err != nil {
		return err
	}
	a.incumbent = c
	var flusher sync.WaitGroup
	flusher.Go(func() { c.Run(ctx) })
	a.onExit(func() {
		c.Close()
		flusher.Wait()
	})
	return nil
}

// loadRules loads the rules files; over xDS there are none yet: an empty
// set answers OK with --xds-before-rules ok, else nil refuses every
// request as Unavailable until rules come.
func (a *app) loadRules(ctx context.Context) error {
	s := a.s
	a.loadOps = config.Options{MergeDomains: s.mergeDomains, GlobalDomains: s.globalDomainList()}
	var err error
	switch {
	case s.xds.opts.Server == "":
		if a.rules, err = config.LoadWith(ctx, a.loadOps, s.config); err != nil {
			a.incumbent.ConfigLoaded(false)
			return fmt.Errorf("rules: %w", err)
		}
		a.m.ConfigLoaded(true, a.rules.Hash, a.rules.LoadedAt)
		a.incumbent.ConfigLoaded(true)
		a.log.Info("rules loaded", "files", len(a.rules.Files), "domains", len(a.rules.Domains()), "hash", a.rules.Hash)
		a.warnGlobalWithoutHome(a.rules)
	case s.xds.beforeRules == "ok":
		a.rules, err = config.LoadDocs(ctx, a.loadOps, nil)
	}
	return err
}

// loadIdentities loads the TLS files of gRPC, Redis and xDS.
func (a *app) loadIdentities(context.Context) error {
	s := a.s
	var err error
	for _, l := range []struct {
		to *(*identity)
		id *identity
	}{
		{&a.grpcID, &identity{name: "grpc", certFlag: "--grpc-tls-cert", caFlag: "--grpc-client-ca", certFile: s.grpcTLSCert, keyFile: s.grpcTLSKey, caFile: s.grpcClientCA}},
		{&a.redisID, &identity{name: "redis", certFlag: "--redis-tls-cert", caFlag: "--redis-tls-ca", certFile: s.redisTLSCert, keyFile: s.redisTLSKey, caFile: s.redisTLSCA}},
		{&a.xdsID, &identity{name: "xds", certFlag: "--xds-tls-cert", caFlag: "--xds-tls-ca", certFile: s.xds.cert, keyFile: s.xds.key, caFile: s.xds.ca}},
	} {
		if *l.to, err = loadIdentity(l.id); err != nil {
			return err
		}
		if *l.to != nil {
			a.ids = append(a.ids, *l.to)
		}
	}
	return nil
}

// startTracing starts the trace pipeline when --tracing-endpoint is set
// (off: a nil pipeline, and no cost on the request path).
func (a *app) startTracing(ctx context.Context) error {
	o := a.s.tracing
	if o.Endpoint == "" {
		return nil
	}
	o.Version, o.OnDrop, o.Logger = version, a.m.SpansLost, a.log
	tr, err := tracing.New(ctx, o)
	if err != nil {
		return fmt.Errorf("--tracing-endpoint: %w", err)
	}
	a.traces = tr
	a.log.Info("exporting traces", "endpoint", o.Endpoint, "protocol", o.Protocol, "sampling_rate", o.SamplingRate)
	a.onExit(func() {
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := tr.Shutdown(sctx); err != nil {
			a.log.Warn("tracing: spans still queued at shutdown were dropped", "err", err)
		}
	})
	return nil
}

// openStore opens the Redis store(s), or the embedded one.
func (a *app) openStore(ctx context.Context) error {
	store, closeStore, err := newStore(ctx, a.s, a.redisID, a.traces.Tracer(), a.m, a.log)
	if err != nil {
		return err
	}
	a.store = store
	a.onExit(closeStore)
	return nil
}

// newService makes the decision service on the store and the local cache.
func (a *app) newService(context.Context) error {
	var cache service.Cache
	if a.s.localCacheSize > 0 {
		cache = overlimitcache.New(int(a.s.localCacheSize))
	}
	o := a.s.svc
	// Each decision and request-level event is told once to each sink:
	// ratelimitd's metrics and envoyproxy/ratelimit's stats.
	o.Recorders = []record.Recorder{metrics.Recorder{M: a.m.Metrics}, incumbentstats.NewRecorder(a.incumbent)}
	o.Logger, o.Traced = a.log, a.traces != nil
	a.svc = service.New(a.rules, a.store, cache, o)
	return nil
}

// startReloads reloads the rules (files or xDS) and the TLS files as they
// change and on SIGHUP, until run returns.
func (a *app) startReloads(ctx context.Context) error {
	s := a.s
	rctx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	a.onExit(func() {
		stop()
		wg.Wait()
	})
	wg.Go(func() {
		onHUP(rctx, func() {
			if s.xds.opts.Server == "" {
				a.apply(config.LoadWith(rctx, a.loadOps, s.config))
			}
			for _, id := range a.ids {
				a.reloadTLS(id)
			}
		})
	})
	// Certificates are watched whatever --watch says: cert-manager and
	// kubelet replace them under a running server.
	for _, id := range a.ids {
		wg.Go(func() {
			err := filewatch.Watch(rctx, id.files(), 0, func() { a.reloadTLS(id) },
				func(err error) { a.log.Error("TLS files watch", "identity", id.name, "err", err) })
			if err != nil {
				a.log.Error("cannot watch the TLS files; reload with SIGHUP", "identity", id.name, "err", err)
			}
		})
	}
	switch {
	case s.xds.opts.Server != "":
		return startXDS(rctx, &wg, xdsStart{x: &s.xds, id: a.xdsID, load: a.loadOps, m: a.m.xds, log: a.log, apply: a.apply})
	case s.watch:
		hash := a.rules.Hash
		wg.Go(func() {
			if err := config.Watch(rctx, []string{s.config}, a.loadOps, 0, hash, a.apply); err != nil {
				a.log.Error("cannot watch the rules; reload with SIGHUP", "err", err)
			}
		})
	}
	return nil
}

// apply puts reloaded rules in force, or keeps those in force when they
// did not load.
func (a *app) apply(rules *config.Snapshot, err error) {
	a.m.ConfigLoaded(err == nil, rules.GetHash(), time.Now())
	a.incumbent.ConfigLoaded(err == nil)
	if err != nil {
		a.log.Error("rules reload failed; keeping the rules in force", "err", err, "hash", a.svc.Rules().GetHash())
		return
	}
	a.svc.SetRules(rules)
	a.log.Info("rules reloaded", "files", len(rules.Files), "domains", len(rules.Domains()), "hash", rules.Hash)
	a.warnGlobalWithoutHome(rules)
}

// warnGlobalWithoutHome says so when rules mark limits global and no home
// Redis is set: each region then enforces its own.
func (a *app) warnGlobalWithoutHome(rules *config.Snapshot) {
	if a.s.globalURL != "" {
		return
	}
	if g := rules.GlobalRules(); len(g) > 0 {
		a.log.Warn("rules mark limits global (rate_limit.global) but --global-redis-url is not set: each region enforces them on its own",
			"limits", len(g), "first", g[0])
	}
}

func (a *app) reloadTLS(id *identity) {
	if err := id.reload(); err != nil {
		a.m.TLSReloaded(id.name, false)
		a.log.Error("TLS files reload failed; keeping the certificates in force", "identity", id.name, "err", err)
		return
	}
	a.m.TLSReloaded(id.name, true)
	a.log.Info("TLS files reloaded; new connections use them", "identity", id.name)
}

// startAside serves what has a listener of its own: the incumbent's
// Prometheus stats and pprof.
func (a *app) startAside(context.Context) error {
	s := a.s
	if s.stats.compatAddr != "" {
		stop, err := serveIncumbentStats(s.stats.compatAddr, s.stats.compatPath, a.incumbent, a.log)
		if err != nil {
			return err
		}
		a.onExit(stop)
	}
	if s.debugAddr != "" {
		stop, err := startDebug(s.debugAddr, a.log)
		if err != nil {
			return err
		}
		a.onExit(stop)
	}
	return nil
}

// startRLQS adds the RLQS server to the gRPC port with --rlqs.
func (a *app) startRLQS(context.Context) error {
	if !a.s.rlqsOn {
		return nil
	}
	g, ok := a.store.(rlqs.Granter)
	if !ok {
		return fmt.Errorf("--rlqs: the store %T cannot grant", a.store)
	}
	o := a.s.rlqs
	o.Metrics, o.Logger = a.m.rlqs, a.log
	a.streams = append(a.streams, rlqs.New(a.svc, g, o))
	a.log.Info("serving RLQS (preview): envoy.service.rate_limit_quota.v3 on the gRPC port", "margin", o.Margin)
	return nil
}

// serve opens the listeners, last, and serves until ctx is done. net.Listen
// never sets SO_REUSEPORT: a second instance cannot silently take part of
// this one's traffic, and a port in use is a startup error.
func (a *app) serve(ctx context.Context) error {
	grpcLis, err := net.Listen("tcp", a.s.grpcAddr)
	if err != nil {
		return fmt.Errorf("--grpc-addr: %w", err)
	}
	httpLis, err := net.Listen("tcp", a.s.httpAddr)
	if err != nil {
		grpcLis.Close()
		return fmt.Errorf("--http-addr: %w", err)
	}
	a.served = true
	srv := server.New(a.svc, server.Options{
		GRPCOptions: grpcServerOptions(a.s, a.grpcID),
		Logger:      a.log,
		DrainDelay:  a.s.drainDelay,
		Tracing:     a.traces,
		Streams:     a.streams,
		Metrics:     promhttp.HandlerFor(a.m.Registry, promhttp.HandlerOpts{ErrorLog: slog.NewLogLogger(a.log.Handler(), slog.LevelError)}),
	})
	return srv.Serve(ctx, grpcLis, httpLis)
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
