package lease

import "github.com/prometheus/client_golang/prometheus"

// Metrics are the leases' collectors: requests by how they were decided,
// grants, their hits and the refiller's calls. A nil *Metrics records
// nothing.
type Metrics struct {
	LeaseDecisions *prometheus.CounterVec
	LeaseGrants    prometheus.Counter
	LeaseHits      *prometheus.CounterVec
	LeaseRefills   *prometheus.CounterVec
}

// NewMetrics makes the leases' collectors and registers them on reg; one
// serves every leased store of a process.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
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
	}
	reg.MustRegister(m.LeaseDecisions, m.LeaseGrants, m.LeaseHits, m.LeaseRefills)
	return m
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
