package service_test

import (
	"testing"

	"github.com/ratelimitd/ratelimitd/internal/metrics"
)

// outcomes sums ratelimitd_decisions_total for outcome over every domain
// and rule: what the tests read instead of a second set of counters.
func outcomes(t testing.TB, m *metrics.Metrics, outcome string) float64 {
	t.Helper()
	fams, err := m.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	sum := 0.0
	for _, f := range fams {
		if f.GetName() != "ratelimitd_decisions_total" {
			continue
		}
		for _, mt := range f.GetMetric() {
			for _, l := range mt.GetLabel() {
				if l.GetName() == "outcome" && l.GetValue() == outcome {
					sum += mt.GetCounter().GetValue()
				}
			}
		}
	}
	return sum
}
