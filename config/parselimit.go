package config

import (
	"fmt"
	"math"

	"gopkg.in/yaml.v3"
)

func (p *parser) rateLimit(n *yaml.Node, path string) *RateLimit {
	f := p.fields(n, path, RateLimitFields...)
	if f == nil {
		return nil
	}
	l := &RateLimit{}
	l.Unlimited = p.boolean(f["unlimited"], path+".unlimited")
	p.leaseAndRejected(f, path, l)
	if v, ok := f["name"]; ok {
		l.Name, _ = p.str(v, path+".name")
		if len(l.Name) > MaxValueBytes {
			p.errorf(v, path+".name", "%d bytes, more than the %d allowed", len(l.Name), MaxValueBytes)
		}
	}
	p.unit(f, n, path, l)
	rpu, hasRPU := f["requests_per_unit"]
	switch {
	case hasRPU:
		l.RequestsPerUnit = p.uint64(rpu, path+".requests_per_unit", MaxRequestsPerUnit)
	case !l.Unlimited:
		p.errorf(n, path+".requests_per_unit", "missing requests_per_unit (write 0 to reject every request)")
	}
	p.algorithm(f, n, path, l)
	if hasRPU && l.Algorithm != AlgorithmFixedWindow && l.RequestsPerUnit > math.MaxUint32 {
		p.errorf(rpu, path+".requests_per_unit", "%d is more than %d, the most a %s counts (fixed_window counts up to %d)",
			l.RequestsPerUnit, uint32(math.MaxUint32), l.Algorithm, uint64(MaxRequestsPerUnit))
	}
	if v, ok := f["calendar"]; ok {
		l.Calendar, l.CalendarSet = p.boolean(v, path+".calendar"), true
		if l.Calendar && !l.CalendarEligible() {
			p.errorf(v, path+".calendar", "calendar needs unit month or year, no unit_multiplier, algorithm fixed_window and no lease")
		}
	}
	if v, ok := f["replaces"]; ok {
		p.replaces(v, path+".replaces", l)
	}
	if v, ok := f["global"]; ok {
		p.global(v, path+".global", l)
	}
	return l
}

// global reads global: one limit across regions, drawn from the home
// Redis as grants; a fixed window without lease or calendar.
func (p *parser) global(v *yaml.Node, path string, l *RateLimit) {
	l.Global = p.boolean(v, path)
	switch {
	case !l.Global:
	case l.Unlimited:
		p.errorf(v, path, "an unlimited rule has nothing to share across regions")
	case l.Algorithm != AlgorithmFixedWindow || l.Lease || l.Calendar:
		p.errorf(v, path, "global needs algorithm fixed_window, no lease and no calendar")
	}
}

// leaseAndRejected reads lease and rejected_hits, which exclude each
// other on a usage budget (leased hits are taken before they are used; a
// charge after the fact cannot come out of a lease).
func (p *parser) leaseAndRejected(f map[string]*yaml.Node, path string, l *RateLimit) {
	if v, ok := f["lease"]; ok {
		l.Lease = p.boolean(v, path+".lease")
		if l.Unlimited && l.Lease {
			p.errorf(v, path+".lease", "an unlimited rule has nothing to lease")
		}
	}
	v, ok := f["rejected_hits"]
	if !ok {
		return
	}
	s, ok := p.str(v, path+".rejected_hits")
	if !ok {
		return
	}
	rh, err := ParseRejectedHits(s)
	switch {
	case err != nil:
		p.errorf(v, path+".rejected_hits", "%v", err)
	case l.Unlimited:
		p.errorf(v, path+".rejected_hits", "an unlimited rule counts nothing")
	case rh == RejectedUsage && l.Lease:
		p.errorf(v, path+".rejected_hits", "a usage budget cannot be leased (drop lease, or set rejected_hits: nothing)")
	}
	l.RejectedHits = rh
}

// unit reads unit: required unless unlimited, refused with it.
func (p *parser) unit(f map[string]*yaml.Node, n *yaml.Node, path string, l *RateLimit) {
	unit, hasUnit := f["unit"]
	switch {
	case l.Unlimited && hasUnit:
		p.errorf(unit, path+".unit", "unlimited: true must not have a unit")
	case !l.Unlimited && !hasUnit:
		p.errorf(n, path+".unit", "missing unit (second, minute, hour, day, week, month or year)")
	case hasUnit:
		if s, ok := p.str(unit, path+".unit"); ok {
			u, err := ParseUnit(s)
			if err != nil {
				p.errorf(unit, path+".unit", "%v", err)
			}
			l.Unit = u
		}
	}
}

// replaces reads the names of the limits a limit replaces: a list of
// {name: ...}, none empty, none its own.
func (p *parser) replaces(v *yaml.Node, path string, l *RateLimit) {
	if v.Kind != yaml.SequenceNode {
		p.errorf(v, path, "want a list of {name: ...}, got %s", kindName(v))
		return
	}
	if !p.charge(1 + len(v.Content)) {
		return
	}
	for i, c := range v.Content {
		if p.stopped {
			break
		}
		c = deref(c)
		cp := fmt.Sprintf("%s[%d]", path, i)
		rf := p.fields(c, cp, ReplacesFields...)
		if rf == nil {
			continue
		}
		var name string
		if nv, ok := rf["name"]; ok {
			name, _ = p.str(nv, cp+".name")
		}
		switch {
		case name == "":
			p.errorf(c, cp+".name", "empty replaces name")
		case name == l.Name:
			p.errorf(c, cp+".name", "a limit cannot replace itself (%q)", name)
		default:
			l.Replaces = append(l.Replaces, name)
		}
	}
}

// MaxRequestsPerUnit is the largest limit of a fixed window: 2^51-1, the
// most Redis's Lua numbers (doubles) count exactly with room for a charge
// past it (limit.MaxLimit). It takes a token budget of 2.25 quadrillion.
const MaxRequestsPerUnit = 1<<51 - 1
