//go:build race

package service_test

// raceEnabled: the race detector slows every goroutine, so the timing
// bounds of chaos tests widen under it; scripts/test.sh runs those tests
// again without it, at their stated bounds.
const raceEnabled = true
