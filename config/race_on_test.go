//go:build race

package config

// raceEnabled: the race detector multiplies memory and time, so tests of
// resource bounds check behaviour only; scripts/test.sh runs them again
// without it, bounds asserted.
const raceEnabled = true
