package global

import "github.com/prometheus/client_golang/prometheus"

// Metrics are the global limits' collectors. A nil *Metrics records
// nothing.
type Metrics struct {
	Requests *prometheus.CounterVec
	Grants   *prometheus.CounterVec
	Hits     *prometheus.CounterVec
	HomeOut  prometheus.Gauge
	Counters prometheus.Gauge
}

// NewMetrics makes the global limits' collectors and registers them on
// reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		Requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ratelimitd_global_requests_total",
			Help: "Global checks (rate_limit.global) by how they were decided: local (from hits held, drawn from the home Redis), waited (found too little held and waited for a draw made at once, then decided again), waited_out (the draw did not come within the home's round trip and 50 ms), short (refused: too little held; not the limit's verdict when the home has more), shared (the home out: decided in this region's store against its share, --global-partition-share).",
		}, []string{"how"}),
		Grants: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ratelimitd_global_grants_total",
			Help: "Calls on the home Redis by result: taken (a draw), empty (a draw: nothing remained), read (what a budget has left, read every refresh), failed (the home did not answer), returned (a give-back).",
		}, []string{"result"}),
		Hits: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ratelimitd_global_hits_total",
			Help: "Hits of global limits: granted (drawn from the home), given_back (unused, returned in their window), lost (unused when their window ended, or a give-back unanswered), unanswered (asked by a draw that failed: spent at the home if it ran); of global budgets' usage charges: charged (paid from hits held), settled (charged beyond what was held, counted at the home), expired (settled more than a window late: not counted), abandoned (not settled when the store closed).",
		}, []string{"what"}),
		HomeOut: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "ratelimitd_global_home_out",
			Help: "1 while the home Redis counts as out (its calls failing for --global-out-after): global checks beyond what is held follow --global-partition.",
		}),
	}
	m.Counters = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "ratelimitd_global_counters",
		Help: "Global counters this instance holds state of (grants, demand, debts, flights), at most 100,000; one unasked for 5 s is given back and forgotten, and, the store full, one unasked for 1 s is forgotten for a new one (what it holds counted lost).",
	})
	reg.MustRegister(m.Requests, m.Grants, m.Hits, m.HomeOut, m.Counters)
	return m
}

func (m *Metrics) request(how string) {
	if m != nil {
		m.Requests.WithLabelValues(how).Inc()
	}
}

func (m *Metrics) grant(result string) {
	if m != nil {
		m.Grants.WithLabelValues(result).Inc()
	}
}

func (m *Metrics) hits(what string, n uint64) {
	if m != nil && n > 0 {
		m.Hits.WithLabelValues(what).Add(float64(n))
	}
}

func (m *Metrics) setCounters(n int) {
	if m != nil {
		m.Counters.Set(float64(n))
	}
}

func (m *Metrics) setOut(out bool) {
	if m != nil {
		v := 0.0
		if out {
			v = 1
		}
		m.HomeOut.Set(v)
	}
}
