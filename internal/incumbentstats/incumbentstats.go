// Package incumbentstats counts what envoyproxy/ratelimit counts, under the
// names it uses, for the dashboards and alerts built on them: per rule
// ratelimit.service.rate_limit.<key path>.{total_hits,over_limit,
// near_limit,within_limit,over_limit_with_local_cache,shadow_mode}, and
// the service's own counters and response time. It flushes them every
// interval to a statsd server (lyft/gostats, the incumbent's own client:
// TCP by default, or UDP) and to a Prometheus registry through
// statsd_exporter's mapper and exporter, the way the incumbent's
// USE_PROMETHEUS sink does. Counting on the request path is an atomic add
// on a counter found without allocating; names that carry request values
// (detailed_metric, value_to_metric, request overrides, unknown domains)
// are bounded per rule.
package incumbentstats

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ratelimitd/ratelimitd/internal/fielderr"
	"github.com/ratelimitd/ratelimitd/internal/record"

	gostats "github.com/lyft/gostats"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/statsd_exporter/pkg/event"
	"github.com/prometheus/statsd_exporter/pkg/exporter"
	"github.com/prometheus/statsd_exporter/pkg/mapper"
	"github.com/prometheus/statsd_exporter/pkg/registry"

	"github.com/ratelimitd/ratelimitd/internal/lograte"
)

//go:embed default_mapper.yaml
var defaultMapping string

// DefaultMapping is the statsd_exporter mapping that gives the incumbent's
// Prometheus names; --compat-metrics-mapper replaces it.
func DefaultMapping() string { return defaultMapping }

// Defaults of [Options].
const (
	DefaultFlushInterval = 10 * time.Second
	DefaultNameCap       = 100
)

// The names' roots, as the incumbent's scopes make them.
const (
	serviceScope = "ratelimit"
	serverScope  = "ratelimit_server"
	// ResponseTimeName is the timer of ShouldRateLimit, in ms.
	responseTime = "ShouldRateLimit.response_time"
)

// Options configures [New]. The zero value counts and sends nowhere.
type Options struct {
	// StatsdAddr is the statsd server, host:port; empty sends no statsd.
	StatsdAddr string
	// StatsdProtocol is "tcp" (empty: the incumbent's default) or "udp".
	StatsdProtocol string
	// DogStatsd sends to StatsdAddr in DogStatsD form instead (UDP, tags
	// as |#k:v), with DataDog's client, as the incumbent's USE_DOG_STATSD.
	DogStatsd bool
	// Mogrifiers rename stats for DogStatsD; the first that matches wins.
	Mogrifiers []Mogrifier
	// Tags are added to every name the way gostats does (.__k=v), as the
	// incumbent's EXTRA_TAGS; the Prometheus sink turns them into labels.
	Tags map[string]string
	// FlushInterval is how often counters are sent; zero means
	// DefaultFlushInterval.
	FlushInterval time.Duration
	// Prometheus builds Registry, served under the mapping's names.
	Prometheus bool
	// Mapping is a statsd_exporter mapping (YAML) replacing the default.
	Mapping string
	// NearLimitRatio starts near_limit at this share of a limit; zero
	// means record.DefaultNearLimitRatio.
	NearLimitRatio float64
	// NameCap bounds the names one rule may add from request values;
	// zero means DefaultNameCap. Later values count under the rule's
	// configured path.
	NameCap int
	// OnSinkError is called for each sink failure (counted by the caller);
	// the log line is rate-limited here.
	OnSinkError func(sink string)
	// Logger receives sink failures, at most one line a minute per sink.
	Logger *slog.Logger
	// Getenv reads the environment gostats' statsd sink reads by itself
	// (GOSTATS_*, USE_STATSD, STATSD_PORT), so that a value it cannot
	// parse is an error here rather than its panic. Nil means os.Getenv.
	Getenv func(string) string
}

// Validate refuses options no sink can run with, naming the field. Zero
// values stand for the defaults. (A statsd address is checked by New: it
// must resolve.)
func (o Options) Validate() error {
	switch {
	case o.StatsdProtocol != "" && o.StatsdProtocol != "tcp" && o.StatsdProtocol != "udp":
		return fielderr.Errorf("incumbentstats", "StatsdProtocol", "%q: want tcp or udp", o.StatsdProtocol)
	case o.DogStatsd && o.StatsdAddr == "":
		return fielderr.Errorf("incumbentstats", "DogStatsd", "needs a statsd address")
	case o.FlushInterval < 0:
		return fielderr.Errorf("incumbentstats", "FlushInterval", "%v: want positive", o.FlushInterval)
	case o.NearLimitRatio < 0 || o.NearLimitRatio > 1:
		return fielderr.Errorf("incumbentstats", "NearLimitRatio", "%v: want in (0, 1]", o.NearLimitRatio)
	}
	return nil
}

// Stats holds the counters and the sinks. A nil *Stats counts nothing.
type Stats struct {
	opts      Options
	store     gostats.Store
	service   gostats.Scope
	server    gostats.Scope
	statsd    gostats.FlushableSink
	dog       *dogSink
	events    chan event.Events
	exported  sync.WaitGroup
	registry  *prometheus.Registry
	mapper    *mapper.MetricMapper
	count     *prometheus.GaugeVec
	respTimer gostats.Timer
	respObs   prometheus.Observer
	respScale float64
	nearRatio float64

	totalRequests, configOK, configErr, redisErr, serviceErr, globalShadow gostats.Counter

	mu          sync.Mutex
	unknown     map[string]gostats.Counter // domain_not_found by domain, bounded
	lastLog     lograte.Keyed              // by sink name
	flushMu     sync.Mutex
	pendingMu   sync.Mutex
	pending     event.Events
	closed      bool // events is closed; guarded by pendingMu
	stopped     atomic.Bool
	flushCancel chan struct{}
}

// ErrAddress is wrapped by the error New returns for a statsd address that
// is malformed or does not resolve.
var ErrAddress = errors.New("statsd address")

// New validates opts, connects nothing yet (a statsd server that is down
// only loses stats, counted), and returns the counters. ctx bounds the
// statsd address's name lookup. Stop with Close.
func New(ctx context.Context, opts Options) (*Stats, error) {
	if opts.FlushInterval <= 0 {
		opts.FlushInterval = DefaultFlushInterval
	}
	if opts.NameCap <= 0 {
		opts.NameCap = DefaultNameCap
	}
	if opts.NearLimitRatio <= 0 || opts.NearLimitRatio > 1 {
		opts.NearLimitRatio = record.DefaultNearLimitRatio
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.Mapping == "" {
		opts.Mapping = defaultMapping
	}
	if opts.Getenv == nil {
		opts.Getenv = os.Getenv
	}
	s := &Stats{opts: opts, nearRatio: opts.NearLimitRatio, unknown: map[string]gostats.Counter{}, flushCancel: make(chan struct{})}
	if opts.StatsdAddr != "" {
		sink, err := s.newStatsd(ctx)
		if err != nil {
			return nil, err
		}
		s.statsd = sink
	}
	if opts.Prometheus {
		if err := s.newPrometheus(); err != nil {
			return nil, err
		}
	}
	s.store = gostats.NewStore(fanout{s}, false)
	s.service = s.store.ScopeWithTags(serviceScope, opts.Tags)
	s.server = s.store.ScopeWithTags(serverScope, opts.Tags)
	svc := s.service.Scope("service")
	s.configOK = svc.NewCounter("config_load_success")
	s.configErr = svc.NewCounter("config_load_error")
	s.globalShadow = svc.NewCounter("global_shadow_mode")
	call := svc.Scope("call.should_rate_limit")
	s.redisErr = call.NewCounter("redis_error")
	s.serviceErr = call.NewCounter("service_error")
	s.totalRequests = s.server.NewCounter("ShouldRateLimit.total_requests")
	s.respTimer = s.server.NewTimer(responseTime)
	s.store.AddStatGenerator(gostats.NewRuntimeStats(s.service.Scope("go")))
	if s.registry != nil {
		if err := s.responseObserver(); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// gostatsEnv are the variables gostats reads by itself when a sink is
// made, panicking on a value it cannot parse; they are checked first so
// that such a value is a startup error naming it.
var gostatsEnv = []struct {
	name string
	ok   func(string) error
}{
	{"USE_STATSD", func(v string) error { _, err := strconv.ParseBool(v); return err }},
	{"STATSD_PORT", func(v string) error { _, err := strconv.Atoi(v); return err }},
	{"GOSTATS_FLUSH_INTERVAL_SECONDS", func(v string) error { _, err := strconv.Atoi(v); return err }},
	{"GOSTATS_LOGGING_SINK_DISABLED", func(v string) error { _, err := strconv.ParseBool(v); return err }},
}

func (s *Stats) newStatsd(ctx context.Context) (gostats.FlushableSink, error) {
	host, portText, err := net.SplitHostPort(s.opts.StatsdAddr)
	if err != nil {
		return nil, fmt.Errorf("%w %q: %w", ErrAddress, s.opts.StatsdAddr, err)
	}
	port, err := strconv.Atoi(portText)
	if err != nil || port <= 0 || port > 65535 {
		return nil, fmt.Errorf("%w %q: port %q is not a port number", ErrAddress, s.opts.StatsdAddr, portText)
	}
	if host == "" {
		host = "localhost"
	}
	if _, err := net.DefaultResolver.LookupHost(ctx, host); err != nil {
		return nil, fmt.Errorf("%w %q: %w", ErrAddress, s.opts.StatsdAddr, err)
	}
	proto := strings.ToLower(s.opts.StatsdProtocol)
	switch {
	case s.opts.DogStatsd && proto != "" && proto != "udp":
		return nil, fmt.Errorf("statsd protocol %q: DogStatsD goes over udp", s.opts.StatsdProtocol)
	case s.opts.DogStatsd:
		d, err := s.newDogStatsd(host, port)
		s.dog = d
		return d, err
	case proto == "":
		proto = "tcp"
	case proto != "tcp" && proto != "udp":
		return nil, fmt.Errorf("statsd protocol %q: want tcp or udp", s.opts.StatsdProtocol)
	}
	for _, e := range gostatsEnv {
		if v := s.opts.Getenv(e.name); v != "" {
			if err := e.ok(v); err != nil {
				return nil, fmt.Errorf("statsd: %s=%q: %w", e.name, v, err)
			}
		}
	}
	return gostats.NewNetSink(gostats.WithStatsdHost(host), gostats.WithStatsdPort(port),
		gostats.WithStatsdProtocol(proto), gostats.WithLogger(sinkLogger{s, "statsd"})), nil
}

// timerTypeRE finds the incumbent's (and older statsd_exporter's)
// timer_type key, which the current mapper calls observer_type.
var timerTypeRE = regexp.MustCompile(`(?m)^(\s*-?\s*)timer_type:`)

func (s *Stats) newPrometheus() error {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	// The mapper warns of every glob it must backtrack on, which the
	// incumbent's own mapping needs: noise to an operator.
	m := &mapper.MetricMapper{Logger: slog.New(slog.DiscardHandler)}
	if err := m.InitFromYAMLString(timerTypeRE.ReplaceAllString(s.opts.Mapping, "${1}observer_type:")); err != nil {
		return fmt.Errorf("statsd_exporter mapping: %w", err)
	}
	vec := func(name, help string, labels ...string) *prometheus.CounterVec {
		c := prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, labels)
		reg.MustRegister(c)
		return c
	}
	unmapped := prometheus.NewCounter(prometheus.CounterOpts{Name: "statsd_exporter_events_unmapped_total", Help: "The total number of StatsD events no mapping was found for."})
	count := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "statsd_exporter_metrics_total", Help: "The total number of metrics."}, []string{"type"})
	reg.MustRegister(unmapped, count)
	exp := exporter.NewExporter(reg, m, s.opts.Logger,
		vec("statsd_exporter_events_actions_total", "The total number of StatsD events by action.", "action"), unmapped,
		vec("statsd_exporter_events_error_total", "The total number of StatsD events discarded due to errors.", "reason"),
		vec("statsd_exporter_events_total", "The total number of StatsD events seen.", "type"),
		vec("statsd_exporter_events_conflict_total", "The total number of StatsD events with conflicting names.", "type"), count)
	s.events = make(chan event.Events, 4)
	s.exported.Go(func() { exp.Listen(s.events) })
	s.registry, s.mapper, s.count = reg, m, count
	return nil
}

// Registry is what the Prometheus sink serves, nil without it.
func (s *Stats) Registry() *prometheus.Registry {
	if s == nil {
		return nil
	}
	return s.registry
}

// responseObserver makes the response-time histogram (or summary) the
// mapping gives, observed directly on each request so that the request
// path sends no event through the exporter.
func (s *Stats) responseObserver() error {
	base, labels := serverScope+"."+responseTime, map[string]string{}
	for k, v := range s.opts.Tags {
		labels[mapper.EscapeMetricName(k)] = v
	}
	mapping, mapped, present := s.mapper.GetMapping(base, mapper.MetricTypeObserver)
	name := mapper.EscapeMetricName(base)
	if mapping == nil {
		mapping = &mapper.MetricMapping{}
	}
	if mapping.Action == mapper.ActionTypeDrop {
		return nil
	}
	if present {
		name = mapper.EscapeMetricName(mapping.Name)
		for k, v := range mapped {
			labels[k] = v
		}
	}
	s.respScale = 1
	if mapping.Scale.Set {
		s.respScale = mapping.Scale.Val
	}
	help := mapping.HelpText
	if help == "" {
		help = "Metric autogenerated by statsd_exporter."
	}
	r := registry.NewRegistry(s.registry, s.mapper)
	t := mapping.ObserverType
	if t == mapper.ObserverTypeDefault {
		t = s.mapper.Defaults.ObserverType
	}
	var err error
	if t == mapper.ObserverTypeHistogram {
		s.respObs, err = r.GetHistogram(name, labels, help, mapping, s.count)
	} else {
		s.respObs, err = r.GetSummary(name, labels, help, mapping, s.count)
	}
	if err != nil {
		return fmt.Errorf("statsd_exporter mapping: response time %s: %w", name, err)
	}
	return nil
}

// Run flushes every interval until ctx is done or Close.
func (s *Stats) Run(ctx context.Context) {
	if s == nil {
		return
	}
	t := time.NewTicker(s.opts.FlushInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-s.flushCancel:
			return
		case <-t.C:
			s.Flush()
		}
	}
}

// Flush sends what was counted since the last flush.
func (s *Stats) Flush() {
	if s == nil {
		return
	}
	s.flushMu.Lock()
	defer s.flushMu.Unlock()
	s.store.Flush()
}

// Close stops Run, flushes a last time (waiting at most a few seconds for
// a statsd server that does not take it), and stops the exporter. The
// statsd client's own connection goroutine lives on: gostats gives no way
// to end it, and it only holds an idle socket.
func (s *Stats) Close() {
	if s == nil || !s.stopped.CompareAndSwap(false, true) {
		return
	}
	close(s.flushCancel)
	done := make(chan struct{})
	go func() {
		s.Flush()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(3 * time.Second):
	}
	if s.dog != nil {
		s.dog.close()
	}
	if s.events != nil {
		s.pendingMu.Lock()
		s.closed = true
		close(s.events)
		s.pendingMu.Unlock()
		s.exported.Wait()
	}
}

// fanout is the store's sink: statsd gets every line, the exporter gets
// counters and gauges in one batch per flush.
type fanout struct{ s *Stats }

func (f fanout) FlushCounter(name string, v uint64) {
	if f.s.statsd != nil {
		f.s.statsd.FlushCounter(name, v)
	}
	f.s.queue(name, func(base string, l map[string]string) event.Event {
		return &event.CounterEvent{CMetricName: base, CValue: float64(v), CLabels: l}
	})
}

func (f fanout) FlushGauge(name string, v uint64) {
	if f.s.statsd != nil {
		f.s.statsd.FlushGauge(name, v)
	}
	f.s.queue(name, func(base string, l map[string]string) event.Event {
		return &event.GaugeEvent{GMetricName: base, GValue: float64(v), GLabels: l}
	})
}

func (f fanout) FlushTimer(name string, v float64) {
	if f.s.statsd != nil {
		f.s.statsd.FlushTimer(name, v)
	}
}

// Flush hands the exporter its batch first: a statsd server slow to
// take its lines then delays only statsd.
func (f fanout) Flush() {
	if f.s.events != nil {
		f.s.pendingMu.Lock()
		if batch := f.s.pending; len(batch) > 0 && !f.s.closed {
			f.s.events <- batch // the exporter takes it at once
		}
		f.s.pending = nil
		f.s.pendingMu.Unlock()
	}
	if f.s.statsd != nil {
		f.s.statsd.Flush()
	}
}

func (s *Stats) queue(name string, ev func(string, map[string]string) event.Event) {
	if s.events == nil {
		return
	}
	base, labels := splitTags(name)
	s.pendingMu.Lock()
	s.pending = append(s.pending, ev(base, labels))
	s.pendingMu.Unlock()
}

// splitTags takes gostats' serialized tags (name.__k=v.__k2=v2) out of a
// name, as labels.
func splitTags(name string) (string, map[string]string) {
	labels := map[string]string{}
	base, rest, ok := strings.Cut(name, ".__")
	if !ok {
		return name, labels
	}
	for _, kv := range strings.Split(rest, ".__") {
		if k, v, ok := strings.Cut(kv, "="); ok {
			labels[mapper.EscapeMetricName(k)] = v
		}
	}
	return base, labels
}

// sinkLogger is gostats' logger: each failure is counted, and logged at
// most once a minute per sink.
type sinkLogger struct {
	s    *Stats
	sink string
}

func (l sinkLogger) Errorf(msg string, args ...any) { l.s.sinkError(l.sink, fmt.Sprintf(msg, args...)) }
func (l sinkLogger) Warnf(msg string, args ...any)  { l.s.sinkError(l.sink, fmt.Sprintf(msg, args...)) }

func (s *Stats) sinkError(sink, msg string) {
	if s.opts.OnSinkError != nil {
		s.opts.OnSinkError(sink)
	}
	if !s.lastLog.Allow(sink, time.Now(), time.Minute) {
		return
	}
	s.opts.Logger.Warn("stats sink failing; its stats are dropped (logged at most once a minute)", "sink", sink, "err", msg)
}
