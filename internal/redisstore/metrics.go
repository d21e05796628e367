package redisstore

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the Redis store's collectors: its calls, breaker, batches,
// script reloads, carried counts, maxmemory policy and charge journal. A
// nil *Metrics records nothing.
type Metrics struct {
	RedisDuration   prometheus.Histogram
	RedisErrors     *prometheus.CounterVec
	ScriptReloads   prometheus.Counter
	IncumbentCounts *prometheus.CounterVec
	BatchSize       prometheus.Histogram
	BreakerOpen     prometheus.Gauge
	BreakerTrips    prometheus.Counter
	MaxmemoryPolicy *prometheus.GaugeVec
	JournalCharges  *prometheus.CounterVec
	JournalPending  prometheus.Gauge
}

// NewMetrics makes the store's collectors and registers them on reg. One
// Metrics serves every store of a process (the main and the per-second
// Redis): they count together.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
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
		JournalCharges: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ratelimitd_charge_journal_total",
			Help: "Usage charges through the charge journal (--charge-journal), by outcome: confirmed (a replica acknowledged it), reapplied (the master changed before that: applied again to the new one), kept (the store could not take it, or its outcome is unknown: kept to apply), applied (a kept charge applied once the store answered), resent (sent and unanswered: sent again, counted once by its mark), refused (Redis refused it applied again with the script's error: dropped), expired (the master changed after its window ended: not applied again), failed (applying it again failed: kept for the next round), dropped (the journal was full: forgotten unconfirmed), no_replica (the master had no replica to confirm it: not kept), abandoned (the process stopped with it unconfirmed).",
		}, []string{"outcome"}),
		JournalPending: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "ratelimitd_charge_journal_pending",
			Help: "Usage charges in the charge journal: recorded by Redis and not yet acknowledged by a replica, or waiting to be applied again after the master changed.",
		}),
	}
	reg.MustRegister(m.RedisDuration, m.RedisErrors, m.ScriptReloads, m.IncumbentCounts, m.BatchSize, m.BreakerOpen,
		m.BreakerTrips, m.MaxmemoryPolicy, m.JournalCharges, m.JournalPending)
	return m
}

// latencyBuckets span 50 µs to 2.5 s, as the service's request
// histogram: a Redis call takes well under a millisecond when healthy,
// and tens of ms at the timeout.
var latencyBuckets = []float64{.00005, .0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5}

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

// ChargeJournal counts n usage charges of the charge journal by outcome.
func (m *Metrics) ChargeJournal(outcome string, n int) {
	if m != nil && n > 0 {
		m.JournalCharges.WithLabelValues(outcome).Add(float64(n))
	}
}

// SetChargeJournal records how many charges the journal holds.
func (m *Metrics) SetChargeJournal(n int) {
	if m != nil {
		m.JournalPending.Set(float64(n))
	}
}
