package metrics

import "testing"

// BenchmarkDecision: a decision's counters as the request path updates
// them (a decision, its hits, the request).
func BenchmarkDecision(b *testing.B) {
	m := New("bench")
	for b.Loop() {
		m.Decision("example", "example.remote_address", "ok")
		m.Hit("example", "example.remote_address", "charged", 1)
		m.Request("OK", 0)
	}
}
