package rlqs

import (
	"testing"
	"time"
)

// TestMeter: counts closer than a second add up; the first rate is taken
// as it is, later ones averaged with the rate before.
func TestMeter(t *testing.T) {
	t0 := time.Unix(1_800_000_000, 0)
	m := newMeter(t0)
	m.add(t0.Add(100*time.Millisecond), 50) // a new bucket's first report, then
	if m.rate >= 0 {
		t.Fatalf("rate %v after 0.1 s, want none yet", m.rate)
	}
	m.add(t0.Add(5*time.Second), 450) // the next periodic one: 500 in 5 s
	if m.rate != 100 {
		t.Fatalf("rate %v, want 100 (500 in 5 s)", m.rate)
	}
	m.add(t0.Add(10*time.Second), 1500) // 300 a second: averaged
	if m.rate != 200 {
		t.Fatalf("rate %v, want 200 ((100 + 300) / 2)", m.rate)
	}
}
