package lease

import "time"

// Meter measures the hits asked of a counter as a smoothed rate: what
// grants are sized by, here and in internal/global.
type Meter struct {
	Asked uint64    // hits asked since From
	From  time.Time // when the last measurement was taken
	Rate  float64   // hits a second, smoothed
}

// Measure folds what was asked since From into Rate, once at least
// every has passed since then.
func (m *Meter) Measure(now time.Time, every time.Duration) {
	el := now.Sub(m.From)
	if el < every {
		return
	}
	inst := float64(m.Asked) / el.Seconds()
	if m.Rate == 0 {
		m.Rate = inst
	} else {
		m.Rate = (m.Rate + inst) / 2
	}
	m.Asked, m.From = 0, now
}
