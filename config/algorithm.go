package config

import (
	"time"

	"gopkg.in/yaml.v3"
)

// maxWindow bounds unit × unit_multiplier, keeping every time in the
// script's integer range (2^53 µs is 285 years).
const maxWindow = 100 * 365 * 24 * time.Hour

// algorithm reads ratelimitd's additions to rate_limit: algorithm, burst
// and unit_multiplier.
func (p *parser) algorithm(f map[string]*yaml.Node, n *yaml.Node, path string, l *RateLimit) {
	l.UnitMultiplier = 1
	if v, ok := f["algorithm"]; ok {
		if s, ok := p.str(v, path+".algorithm"); ok {
			found := false
			for i, name := range algorithmNames {
				if s == name {
					l.Algorithm, found = Algorithm(i), true
				}
			}
			if !found {
				p.errorf(v, path+".algorithm", "unknown algorithm %q (want fixed_window, sliding_window or token_bucket)", s)
			}
		}
	}
	if v, ok := f["unit_multiplier"]; ok {
		l.UnitMultiplier = p.uint32(v, path+".unit_multiplier", 1)
		switch {
		case l.UnitMultiplier == 0:
			l.UnitMultiplier = 1 // said out of range
		case l.Unit != UnitUnknown && l.Window() > maxWindow:
			p.errorf(v, path+".unit_multiplier", "a window of %d %ss is longer than 100 years", l.UnitMultiplier, l.Unit)
			l.UnitMultiplier = 1
		}
	}
	if v, ok := f["burst"]; ok {
		l.Burst = p.uint32(v, path+".burst", 1)
		switch {
		case l.Algorithm != AlgorithmTokenBucket:
			p.errorf(v, path+".burst", "burst needs algorithm: token_bucket")
		case l.Burst == 0: // said out of range (omitted, it is requests_per_unit)
		case l.RequestsPerUnit > 0 && l.Unit != UnitUnknown:
			// The bucket's capacity in µs must stay in the script's exact
			// integer range.
			interval := (l.Window().Microseconds() + int64(l.RequestsPerUnit) - 1) / int64(l.RequestsPerUnit)
			if float64(l.Burst)*float64(interval) > 1<<52 {
				p.errorf(v, path+".burst", "burst %d of %s intervals is too large", l.Burst, time.Duration(interval)*time.Microsecond)
			}
		}
	}
	if l.Unlimited {
		for _, k := range []string{"algorithm", "burst", "unit_multiplier"} {
			if v, ok := f[k]; ok {
				p.errorf(v, path+"."+k, "unlimited: true takes no %s", k)
			}
		}
	}
}
