// Package metrics holds the registry /metrics serves and the process's
// own collectors: the service's decisions (counted through Recorder),
// rules and TLS reloads, the stats sink's and the tracer's losses, and
// the build. Each other room (redisstore, lease, rlqs, xds) registers
// its own collectors on the registry; cmd/ratelimitd's metric list test
// holds every name and help text. Labels are bounded: domains and rules
// come from the rules files, never from requests.
package metrics

import (
	"runtime"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

// Metrics holds the collectors. A nil *Metrics records nothing, so
// packages can be used without metrics in tests.
type Metrics struct {
	// Registry is where the collectors live; /metrics serves it.
	Registry *prometheus.Registry

	// Children of the per-decision vectors by label values: the request
	// path finds one with a map lookup, without the vector's label
	// checks and lock (about a tenth of a decision's own CPU).
	decisions, hits, requests childCache

	Decisions         *prometheus.CounterVec
	Hits              *prometheus.CounterVec
	Requests          *prometheus.CounterVec
	UnknownDomain     prometheus.Counter
	InvalidRequests   prometheus.Counter
	CanceledRequests  prometheus.Counter
	ShadowRequests    prometheus.Counter
	RequestDuration   prometheus.Histogram
	ConfigReloads     *prometheus.CounterVec
	TLSReloads        *prometheus.CounterVec
	ConfigLastSuccess prometheus.Gauge
	ConfigInfo        *prometheus.GaugeVec
	StatsSinkErrors   *prometheus.CounterVec
	SpansDropped      *prometheus.CounterVec
}

// New registers the process's collectors, with Go and process
// collectors, on a new registry.
func New(version string) *Metrics {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	m := &Metrics{
		Registry: reg,
		Decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ratelimitd_decisions_total",
			Help: "Descriptor decisions by domain, rule (its name, else its path) and outcome.",
		}, []string{"domain", "rule", "outcome"}),
		Hits: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ratelimitd_hits_total",
			Help: "Hits (hits_addend: tokens, cost) of counted descriptors by domain, rule and result: charged (recorded on the counter), refused (not recorded: the call was refused), lost (not recorded: the store refused or could not be reached, and the failure policy answered) unknown (maybe recorded: the store call timed out, or the caller went away) or kept (a usage charge the store could not take, or whose outcome is unknown, kept by the charge journal to apply when it answers: see ratelimitd_charge_journal_total).",
		}, []string{"domain", "rule", "result"}),
		Requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ratelimitd_requests_total",
			Help: "ShouldRateLimit requests decided, by overall code.",
		}, []string{"code"}),
		UnknownDomain: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ratelimitd_unknown_domain_total",
			Help: "Requests for a domain no rules file defines (answered OK, no limit).",
		}),
		InvalidRequests: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ratelimitd_invalid_requests_total",
			Help: "Requests refused as invalid (empty domain, no descriptors, over the size bounds).",
		}),
		ShadowRequests: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ratelimitd_shadow_requests_total",
			Help: "Requests over a limit answered OK by global shadow mode (--shadow-mode).",
		}),
		CanceledRequests: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ratelimitd_canceled_requests_total",
			Help: "Requests whose caller canceled before the store decided them: not answered, not counted as failures.",
		}),
		RequestDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "ratelimitd_request_duration_seconds",
			Help:    "Time to decide one request, store call included.",
			Buckets: latencyBuckets,
		}),
		TLSReloads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ratelimitd_tls_reloads_total",
			Help: "Reloads of TLS certificate files by identity (grpc: the served pair and client CA; redis and xds: the client pair and CA) and result; a failure keeps the files in force.",
		}, []string{"identity", "result"}),
		ConfigReloads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ratelimitd_config_reloads_total",
			Help: "Rules loads by result (success, failure).",
		}, []string{"result"}),
		ConfigLastSuccess: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "ratelimitd_config_last_reload_success_timestamp_seconds",
			Help: "Unix time of the last successful rules load.",
		}),
		ConfigInfo: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "ratelimitd_config_info",
			Help: "1 for the rules in force, labelled with their hash.",
		}, []string{"hash"}),
		StatsSinkErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ratelimitd_stats_sink_errors_total",
			Help: "Failures of the sink of envoyproxy/ratelimit's stats (statsd: cannot connect, or lines dropped); its stats are lost, decisions never wait for it.",
		}, []string{"sink"}),
		SpansDropped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ratelimitd_trace_spans_dropped_total",
			Help: "Trace spans lost by reason: queue_full (the collector is slower than the spans come) or export_failed (it refused them or could not be reached); decisions never wait for it.",
		}, []string{"reason"}),
	}
	buildInfo := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "ratelimitd_build_info",
		Help: "1, labelled with the version and the Go version.",
	}, []string{"version", "goversion"})
	buildInfo.WithLabelValues(version, runtime.Version()).Set(1)
	reg.MustRegister(m.Decisions, m.Hits, m.Requests, m.UnknownDomain, m.InvalidRequests, m.CanceledRequests, m.ShadowRequests,
		m.RequestDuration, m.ConfigReloads, m.TLSReloads, m.ConfigLastSuccess, m.ConfigInfo, m.StatsSinkErrors, m.SpansDropped, buildInfo)
	return m
}

// latencyBuckets span 50 µs to 2.5 s: decisions take well under a
// millisecond when healthy, and tens of ms at the timeout. The Redis
// store's call histogram has the same, so the two read side by side.
var latencyBuckets = []float64{.00005, .0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5}

// Decision counts one descriptor decision.
func (m *Metrics) Decision(domain, rule, outcome string) {
	if m != nil {
		m.decisions.counter3(m.Decisions, domain, rule, outcome).Inc()
	}
}

// Hit counts the hits of one counted descriptor by what became of them:
// charged, refused or lost.
func (m *Metrics) Hit(domain, rule, result string, hits uint64) {
	if m != nil && hits > 0 {
		m.hits.counter3(m.Hits, domain, rule, result).Add(float64(hits))
	}
}

// Request counts one decided request and its duration.
func (m *Metrics) Request(code string, d time.Duration) {
	if m != nil {
		m.requests.counter1(m.Requests, code).Inc()
		m.RequestDuration.Observe(d.Seconds())
	}
}

// InvalidRequest counts a request refused as invalid.
func (m *Metrics) InvalidRequest() {
	if m != nil {
		m.InvalidRequests.Inc()
	}
}

// TLSReloaded counts a reload of an identity's TLS files.
func (m *Metrics) TLSReloaded(identity string, ok bool) {
	if m != nil {
		result := "success"
		if !ok {
			result = "failure"
		}
		m.TLSReloads.WithLabelValues(identity, result).Inc()
	}
}

// ShadowRequest counts a request over a limit let through by global
// shadow mode.
func (m *Metrics) ShadowRequest() {
	if m != nil {
		m.ShadowRequests.Inc()
	}
}

// CanceledRequest counts a request its caller canceled before the store
// decided it.
func (m *Metrics) CanceledRequest() {
	if m != nil {
		m.CanceledRequests.Inc()
	}
}

// UnknownDomainRequest counts a request for a domain no rules define.
func (m *Metrics) UnknownDomainRequest() {
	if m != nil {
		m.UnknownDomain.Inc()
	}
}

// ConfigLoaded records a rules load; hash is empty on failure.
func (m *Metrics) ConfigLoaded(ok bool, hash string, at time.Time) {
	if m == nil {
		return
	}
	if !ok {
		m.ConfigReloads.WithLabelValues("failure").Inc()
		return
	}
	m.ConfigReloads.WithLabelValues("success").Inc()
	m.ConfigLastSuccess.Set(float64(at.UnixNano()) / 1e9)
	m.ConfigInfo.Reset()
	m.ConfigInfo.WithLabelValues(hash).Set(1)
}

// StatsSinkError counts a failure of a stats sink.
func (m *Metrics) StatsSinkError(sink string) {
	if m != nil {
		m.StatsSinkErrors.WithLabelValues(sink).Inc()
	}
}

// SpansLost counts trace spans dropped for reason.
func (m *Metrics) SpansLost(reason string, n int) {
	if m != nil {
		m.SpansDropped.WithLabelValues(reason).Add(float64(n))
	}
}

// childCache holds a CounterVec's children by their label values.
// Children are never deleted from the vectors it serves, so a cached one
// stays the vector's.
type childCache struct{ m sync.Map } // [3]string → prometheus.Counter

// counter3 is vec's child of three labels.
func (c *childCache) counter3(vec *prometheus.CounterVec, a, b, d string) prometheus.Counter {
	if v, ok := c.m.Load([3]string{a, b, d}); ok {
		return v.(prometheus.Counter)
	}
	v, _ := c.m.LoadOrStore([3]string{a, b, d}, vec.WithLabelValues(a, b, d))
	return v.(prometheus.Counter)
}

// counter1 is vec's child of one label.
func (c *childCache) counter1(vec *prometheus.CounterVec, a string) prometheus.Counter {
	if v, ok := c.m.Load([3]string{a}); ok {
		return v.(prometheus.Counter)
	}
	v, _ := c.m.LoadOrStore([3]string{a}, vec.WithLabelValues(a))
	return v.(prometheus.Counter)
}
