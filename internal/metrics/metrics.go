// Package metrics defines every Prometheus collector of ratelimitd in one
// place, so names stay consistent and documented. Labels are bounded:
// domains and rules come from the rules files, never from requests.
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
	RedisDuration     prometheus.Histogram
	RedisErrors       *prometheus.CounterVec
	ScriptReloads     prometheus.Counter
	IncumbentCounts   *prometheus.CounterVec
	BatchSize         prometheus.Histogram
	BreakerOpen       prometheus.Gauge
	BreakerTrips      prometheus.Counter
	MaxmemoryPolicy   *prometheus.GaugeVec
	ConfigReloads     *prometheus.CounterVec
	TLSReloads        *prometheus.CounterVec
	ConfigLastSuccess prometheus.Gauge
	ConfigInfo        *prometheus.GaugeVec
	XDSConnected      prometheus.Gauge
	LeaseDecisions    *prometheus.CounterVec
	LeaseGrants       prometheus.Counter
	LeaseHits         *prometheus.CounterVec
	LeaseRefills      *prometheus.CounterVec
	StatsSinkErrors   *prometheus.CounterVec
	SpansDropped      *prometheus.CounterVec
	RLQSStreams       prometheus.Gauge
	RLQSBuckets       prometheus.Gauge
	RLQSAssignments   *prometheus.CounterVec
	RLQSGrants        *prometheus.CounterVec
	RLQSGrantHits     *prometheus.CounterVec
	RLQSRejected      *prometheus.CounterVec
	JournalCharges    *prometheus.CounterVec
	JournalPending    prometheus.Gauge
}

// New registers every collector, with Go and process collectors, on a new
// registry.
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
		RedisDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "ratelimitd_redis_duration_seconds",
			Help:    "Time of one Redis script evaluation (a request, or one slot group on Cluster), failures included.",
			Buckets: latencyBuckets,
		}),
		RedisErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ratelimitd_redis_errors_total",
			Help: "Failed Redis evaluations by class: timeout, connection, breaker_open, overload (batch queue full), canceled (the caller gave up), noreplicas, oom, readonly, loading, clusterdown, masterdown, busy, other.",
		}, []string{"class"}),
		ScriptReloads: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ratelimitd_redis_script_reloads_total",
			Help: "Times Redis had lost the script (NOSCRIPT) and it was sent again.",
		}),
		IncumbentCounts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ratelimitd_incumbent_counts_total",
			Help: "Counters started from envoyproxy/ratelimit's count (--carry-incumbent-counts) by result: carried, or not_a_count (its key held something else: ignored).",
		}, []string{"result"}),
		BatchSize: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "ratelimitd_redis_batch_size",
			Help:    "Requests decided together in one script call (one round trip).",
			Buckets: []float64{1, 2, 4, 8, 16, 32, 64, 128},
		}),
		BreakerOpen: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "ratelimitd_redis_breaker_open",
			Help: "1 while the breaker is open: Redis is not asked, requests are answered by failure policy.",
		}),
		BreakerTrips: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ratelimitd_redis_breaker_trips_total",
			Help: "Times the breaker opened.",
		}),
		MaxmemoryPolicy: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "ratelimitd_redis_maxmemory_policy",
			Help: "1 for the maxmemory-policy Redis reports (per node on Cluster); anything but noeviction can evict counters.",
		}, []string{"node", "policy"}),
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
		LeaseDecisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ratelimitd_lease_requests_total",
			Help: "Requests touching a leased counter (lease: true): local (decided in process from grants alone), waited (a grant fell short and Redis decided the rest) or cold (no grant yet: the counter's rate is too low to earn one; decided in Redis as without lease).",
		}, []string{"how"}),
		LeaseGrants: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ratelimitd_lease_grants_total",
			Help: "Grants taken from leased counters in Redis.",
		}),
		LeaseHits: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ratelimitd_lease_hits_total",
			Help: "Hits of leased counters: granted (taken from Redis), given_back (unused, returned in their window), lost (unused when their window ended, or not returned).",
		}, []string{"what"}),
		LeaseRefills: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ratelimitd_lease_refills_total",
			Help: "Script calls of the lease refiller (takes and give-backs of many counters at once) by result.",
		}, []string{"result"}),
		StatsSinkErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ratelimitd_stats_sink_errors_total",
			Help: "Failures of the sink of envoyproxy/ratelimit's stats (statsd: cannot connect, or lines dropped); its stats are lost, decisions never wait for it.",
		}, []string{"sink"}),
		SpansDropped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ratelimitd_trace_spans_dropped_total",
			Help: "Trace spans lost by reason: queue_full (the collector is slower than the spans come) or export_failed (it refused them or could not be reached); decisions never wait for it.",
		}, []string{"reason"}),
		RLQSStreams: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "ratelimitd_rlqs_streams",
			Help: "Open RLQS streams (--rlqs): one per Envoy and domain.",
		}),
		RLQSBuckets: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "ratelimitd_rlqs_buckets",
			Help: "RLQS buckets the open streams report.",
		}),
		RLQSAssignments: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ratelimitd_rlqs_assignments_total",
			Help: "Bucket actions sent to Envoys by kind: token_bucket (a grant), allow_all (no limit, shadow, or failure_mode allow), deny_all (budget spent, before a fresh grant, or failure_mode deny), abandon (idle).",
		}, []string{"kind"}),
		RLQSGrants: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ratelimitd_rlqs_grants_total",
			Help: "Grants asked of the store for RLQS buckets by result: taken, empty (nothing remained), failed (the store could not answer: the failure mode decides), returned (taken too near the window's end to hand out, given back).",
		}, []string{"result"}),
		RLQSGrantHits: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ratelimitd_rlqs_grant_hits_total",
			Help: "Hits of RLQS grants: granted (taken from the counter and handed to an Envoy), given_back (returned unused), lost (left in grants replaced or expired, by the Envoys' last reports: an upper bound, as they may have spent some since).",
		}, []string{"what"}),
		RLQSRejected: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ratelimitd_rlqs_reports_rejected_total",
			Help: "RLQS usage reports (whole messages) or bucket reports refused, by reason: bucket_id_empty, bucket_id_too_large, too_many_buckets, too_many_streams, bad_domain. A refused bucket gets no assignment: Envoy's no_assignment_behavior decides it.",
		}, []string{"reason"}),
		JournalCharges: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ratelimitd_charge_journal_total",
			Help: "Usage charges through the charge journal (--charge-journal), by outcome: confirmed (a replica acknowledged it), reapplied (the master changed before that: applied again to the new one), kept (the store could not take it, or its outcome is unknown: kept to apply), applied (a kept charge applied once the store answered), assumed (sent, unanswered, to a master still master: taken as recorded), refused (Redis refused it applied again with the script's error: dropped), expired (the master changed after its window ended: not applied again), failed (applying it again failed: kept for the next round), dropped (the journal was full: forgotten unconfirmed), no_replica (the master had no replica to confirm it: not kept), abandoned (the process stopped with it unconfirmed).",
		}, []string{"outcome"}),
		JournalPending: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "ratelimitd_charge_journal_pending",
			Help: "Usage charges in the charge journal: recorded by Redis and not yet acknowledged by a replica, or waiting to be applied again after the master changed.",
		}),
		XDSConnected: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "ratelimitd_xds_connected",
			Help: "1 while the stream to the xDS management server (--xds-server) is open; the rules in force stay while it is not.",
		}),
	}
	buildInfo := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "ratelimitd_build_info",
		Help: "1, labelled with the version and the Go version.",
	}, []string{"version", "goversion"})
	buildInfo.WithLabelValues(version, runtime.Version()).Set(1)
	reg.MustRegister(m.Decisions, m.Hits, m.Requests, m.UnknownDomain, m.InvalidRequests, m.CanceledRequests, m.ShadowRequests, m.RequestDuration,
		m.RedisDuration, m.RedisErrors, m.ScriptReloads, m.IncumbentCounts, m.BatchSize, m.BreakerOpen, m.BreakerTrips,
		m.MaxmemoryPolicy, m.ConfigReloads, m.TLSReloads, m.ConfigLastSuccess, m.ConfigInfo, m.XDSConnected,
		m.LeaseDecisions, m.LeaseGrants, m.LeaseHits, m.LeaseRefills, m.StatsSinkErrors, m.SpansDropped,
		m.RLQSStreams, m.RLQSBuckets, m.RLQSAssignments, m.RLQSGrants, m.RLQSGrantHits, m.RLQSRejected,
		m.JournalCharges, m.JournalPending, buildInfo)
	return m
}

// latencyBuckets span 50 µs to 2.5 s: decisions take well under a
// millisecond when healthy, and tens of ms at the timeout.
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

// RedisCall records one evaluation's duration and, when it failed, its
// error class.
func (m *Metrics) RedisCall(d time.Duration, errClass string) {
	if m == nil {
		return
	}
	m.RedisDuration.Observe(d.Seconds())
	if errClass != "" {
		m.RedisErrors.WithLabelValues(errClass).Inc()
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

// ScriptReload counts a NOSCRIPT reload.
func (m *Metrics) ScriptReload() {
	if m != nil {
		m.ScriptReloads.Inc()
	}
}

// IncumbentCount counts a counter started from envoyproxy/ratelimit's
// count, or an incumbent key ignored (result not_a_count).
func (m *Metrics) IncumbentCount(result string) {
	if m != nil {
		m.IncumbentCounts.WithLabelValues(result).Inc()
	}
}

// Batch records the size of one pipeline.
func (m *Metrics) Batch(n int) {
	if m != nil {
		m.BatchSize.Observe(float64(n))
	}
}

// SetBreaker records the breaker's state.
func (m *Metrics) SetBreaker(open bool) {
	if m == nil {
		return
	}
	if open {
		m.BreakerOpen.Set(1)
		m.BreakerTrips.Inc()
	} else {
		m.BreakerOpen.Set(0)
	}
}

// SetMaxmemoryPolicy records node's policy, replacing what it reported
// before.
func (m *Metrics) SetMaxmemoryPolicy(node, policy string) {
	if m == nil {
		return
	}
	m.MaxmemoryPolicy.DeletePartialMatch(prometheus.Labels{"node": node})
	m.MaxmemoryPolicy.WithLabelValues(node, policy).Set(1)
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

// XDSStream records whether the xDS stream is open.
func (m *Metrics) XDSStream(open bool) {
	if m == nil {
		return
	}
	v := 0.0
	if open {
		v = 1
	}
	m.XDSConnected.Set(v)
}

// LeaseRequest counts a request touching a leased counter by how it was
// decided: local (from grants alone), waited (a grant fell short, Redis
// decided the rest) or cold (no grant yet; decided in Redis).
func (m *Metrics) LeaseRequest(how string) {
	if m != nil {
		m.LeaseDecisions.WithLabelValues(how).Inc()
	}
}

// LeaseGranted counts one take and the hits it got.
func (m *Metrics) LeaseGranted(hits uint64) {
	if m != nil {
		m.LeaseGrants.Inc()
		m.LeaseHits.WithLabelValues("granted").Add(float64(hits))
	}
}

// LeaseGivenBack counts hits given back, and those that could not be
// (their window had ended).
func (m *Metrics) LeaseGivenBack(back, lost uint64) {
	if m != nil {
		m.LeaseHits.WithLabelValues("given_back").Add(float64(back))
		m.LeaseHits.WithLabelValues("lost").Add(float64(lost))
	}
}

// LeaseLost counts granted hits that went unused.
func (m *Metrics) LeaseLost(hits uint64) {
	if m != nil {
		m.LeaseHits.WithLabelValues("lost").Add(float64(hits))
	}
}

// LeaseRefill counts one refiller script call.
func (m *Metrics) LeaseRefill(ok bool) {
	if m != nil {
		result := "success"
		if !ok {
			result = "failure"
		}
		m.LeaseRefills.WithLabelValues(result).Inc()
	}
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
