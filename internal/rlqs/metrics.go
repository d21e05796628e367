package rlqs

import "github.com/prometheus/client_golang/prometheus"

// Metrics are the RLQS server's collectors: streams, buckets, the actions
// sent, grants and refused reports. A nil *Metrics records nothing.
type Metrics struct {
	RLQSStreams     prometheus.Gauge
	RLQSBuckets     prometheus.Gauge
	RLQSAssignments *prometheus.CounterVec
	RLQSGrants      *prometheus.CounterVec
	RLQSGrantHits   *prometheus.CounterVec
	RLQSRejected    *prometheus.CounterVec
}

// NewMetrics makes the RLQS collectors and registers them on reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
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
	}
	reg.MustRegister(m.RLQSStreams, m.RLQSBuckets, m.RLQSAssignments, m.RLQSGrants, m.RLQSGrantHits, m.RLQSRejected)
	return m
}

// RLQSStream counts an RLQS stream opening (+1) or ending (-1).
func (m *Metrics) RLQSStream(delta int) {
	if m != nil {
		m.RLQSStreams.Add(float64(delta))
	}
}

// RLQSBucket counts RLQS buckets added (+n) or dropped (-n).
func (m *Metrics) RLQSBucket(delta int) {
	if m != nil {
		m.RLQSBuckets.Add(float64(delta))
	}
}

// RLQSAssignment counts one bucket action sent, by kind.
func (m *Metrics) RLQSAssignment(kind string) {
	if m != nil {
		m.RLQSAssignments.WithLabelValues(kind).Inc()
	}
}

// RLQSGrant counts one grant asked for RLQS by result, and its hits
// (granted for a take, given_back for a return).
func (m *Metrics) RLQSGrant(result string, hits uint64) {
	if m != nil {
		m.RLQSGrants.WithLabelValues(result).Inc()
		switch result {
		case "taken":
			m.RLQSGrantHits.WithLabelValues("granted").Add(float64(hits))
		case "returned":
			m.RLQSGrantHits.WithLabelValues("given_back").Add(float64(hits))
		}
	}
}

// RLQSGrantLost counts hits left unspent in a replaced RLQS grant.
func (m *Metrics) RLQSGrantLost(hits uint64) {
	if m != nil {
		m.RLQSGrantHits.WithLabelValues("lost").Add(float64(hits))
	}
}

// RLQSReject counts a refused RLQS report or bucket report.
func (m *Metrics) RLQSReject(reason string) {
	if m != nil {
		m.RLQSRejected.WithLabelValues(reason).Inc()
	}
}
