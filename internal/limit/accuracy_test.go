package limit

import (
	"math/rand/v2"
	"testing"
)

// TestSlidingWindowAccuracy compares the sliding window's weighted
// estimate with an exact sliding log on synthetic traffic: a limit of 100
// per minute, offered at 1.5 times the limit on average, in bursts and
// gaps, over 200 minutes. It reports the share of requests decided
// differently and how far the estimate lets the true count of the last
// minute exceed the limit. Reproduce with
//
//	go test -run SlidingWindowAccuracy -v ./internal/limit/
func TestSlidingWindowAccuracy(t *testing.T) {
	for _, load := range []float64{0.8, 1.5, 3} {
		simulateSliding(t, load)
	}
}

// simulateSliding offers load times the limit on average.
func simulateSliding(t *testing.T, load float64) {
	const (
		limit    = 100
		windowUS = 60e6
		minutes  = 200
	)
	rng := rand.New(rand.NewPCG(7, 11))
	c := []Check{{Limit: limit, WindowUS: windowUS, Algorithm: SlidingWindow, Hits: 1}}
	st, found := []State{{}}, []bool{false}
	res, exp := make([]Result, 1), make([]int64, 1)
	var logExact, logEst []int64 // admitted times under each
	inWindow := func(log []int64, now int64) int {
		n := 0
		for i := len(log) - 1; i >= 0 && log[i] > now-windowUS; i-- {
			n++
		}
		return n
	}
	var requests, falseAdmit, falseReject, overshootSum, overshootMax, overshootN int
	now := int64(1e12)
	end := now + minutes*windowUS
	for now < end {
		// Bursts: a tenth of the gaps are 6 times shorter.
		gap := rng.ExpFloat64() * windowUS / (load * limit)
		if rng.IntN(10) == 0 {
			gap /= 6
		}
		now += int64(gap) + 1
		requests++
		if inWindow(logExact, now) < limit {
			logExact = append(logExact, now)
		}
		// What an exact log would decide on the estimate's own history.
		exact := inWindow(logEst, now) < limit
		ok := Decide(c, st, found, now, res, exp)
		found[0] = exp[0] != 0
		switch {
		case ok && !exact:
			falseAdmit++
		case !ok && exact:
			falseReject++
		}
		if ok {
			logEst = append(logEst, now)
			if over := inWindow(logEst, now) - limit; over > 0 {
				overshootSum += over
				overshootMax = max(overshootMax, over)
				overshootN++
			}
		}
	}
	mean := 0.0
	if overshootN > 0 {
		mean = float64(overshootSum) / float64(overshootN)
	}
	pct := func(n int) float64 { return 100 * float64(n) / float64(requests) }
	t.Logf("load %.1fx: %d requests; admitted: exact log %d, sliding window %d (%+.1f%%); decided otherwise than an exact log on the same history: %.2f%% (%.2f%% admitted too many, %.2f%% rejected too many); last-minute count over the limit after %.2f%% of admissions, by %.2f on average, %d at most",
		load, requests, len(logExact), len(logEst), 100*(float64(len(logEst))/float64(len(logExact))-1),
		pct(falseAdmit+falseReject), pct(falseAdmit), pct(falseReject), 100*float64(overshootN)/float64(max(len(logEst), 1)), mean, overshootMax)
	// Guards against a regression of the estimate: over time it admits
	// what an exact log does, within 5 %, and the last minute never holds
	// twice the limit (the estimate's bound: it assumes the previous
	// window's hits were spread evenly, and a burst at its end can count
	// again by up to the limit).
	if len(logEst) > len(logExact)*105/100 || overshootMax >= limit {
		t.Errorf("load %.1fx: sliding window too far from the exact log", load)
	}
}
