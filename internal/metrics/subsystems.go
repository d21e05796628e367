package metrics

// The counts of RLQS (internal/rlqs) and of the charge journal
// (internal/redisstore); their collectors are made and registered in New.

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
