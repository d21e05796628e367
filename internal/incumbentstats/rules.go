package incumbentstats

import (
	"math"
	"regexp"
	"strings"
	"sync"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	gostats "github.com/lyft/gostats"

	"github.com/ratelimitd/ratelimitd/config"
)

// Counters are one key path's six counters. A nil *Counters counts
// nothing.
type Counters struct {
	totalHits, overLimit, nearLimit, withinLimit, overLocal, shadow gostats.Counter
	nearRatio                                                       float64
}

// Rules are the counters of one rules snapshot's rules, made when the
// snapshot is put in force so that a request finds them without
// allocating. A nil *Rules counts nothing.
type Rules struct {
	s      *Stats
	static map[*config.Rule]*Counters

	mu      sync.Mutex
	dynamic map[string]*Counters
	perRule map[*config.Rule]int // dynamic names handed out; nil: overrides
}

// ForRules makes the counters of snap's limited rules.
func (s *Stats) ForRules(snap *config.Snapshot) *Rules {
	if s == nil || snap == nil {
		return nil
	}
	rs := &Rules{s: s, static: map[*config.Rule]*Counters{}, dynamic: map[string]*Counters{}, perRule: map[*config.Rule]int{}}
	for _, d := range snap.Domains() {
		for _, r := range snap.Domain(d).Rules() {
			if r.Limit != nil && !r.Limit.Unlimited {
				rs.static[r] = s.counters(r.Path)
			}
		}
	}
	return rs
}

func (s *Stats) counters(path string) *Counters {
	sc := s.service.Scope("service.rate_limit." + Sanitize(path))
	return &Counters{
		totalHits: sc.NewCounter("total_hits"), overLimit: sc.NewCounter("over_limit"),
		nearLimit: sc.NewCounter("near_limit"), withinLimit: sc.NewCounter("within_limit"),
		overLocal: sc.NewCounter("over_limit_with_local_cache"), shadow: sc.NewCounter("shadow_mode"),
		nearRatio: s.nearRatio,
	}
}

// For returns the counters of a descriptor decided by rule r (nil for a
// request's own limit) of domain: the rule's path, or the path the
// incumbent builds from the request's values for detailed_metric,
// value_to_metric and overrides, at most NameCap of those per rule.
func (rs *Rules) For(domain string, r *config.Rule, ents []*rlcommon.RateLimitDescriptor_Entry) *Counters {
	if rs == nil {
		return nil
	}
	if r != nil && !dynamic(r) {
		return rs.static[r]
	}
	name := pathOf(domain, r, ents)
	rs.mu.Lock()
	defer rs.mu.Unlock()
	if c, ok := rs.dynamic[name]; ok {
		return c
	}
	if rs.perRule[r] >= rs.s.opts.NameCap {
		if r == nil {
			return nil // overrides past the cap are not counted
		}
		return rs.static[r]
	}
	rs.perRule[r]++
	c := rs.s.counters(name)
	rs.dynamic[name] = c
	return c
}

// dynamic reports whether r's path depends on the request's values.
func dynamic(r *config.Rule) bool {
	if r.DetailedMetric {
		return true
	}
	for l := r; l != nil; l = l.Parent() {
		if l.ValueToMetric {
			return true
		}
	}
	return false
}

// pathOf builds the incumbent's key path: with detailed_metric every level
// is key_<request value>; with value_to_metric a key-only or wildcard
// level takes the request's value; share_threshold keeps the pattern; an
// override is the request's own entries. Dots of IPv4-looking runs become
// '_' later, in Sanitize, as for every name.
func pathOf(domain string, r *config.Rule, ents []*rlcommon.RateLimitDescriptor_Entry) string {
	var b strings.Builder
	b.WriteString(domain)
	if r == nil {
		for _, e := range ents {
			seg(&b, e.GetKey(), e.GetValue())
		}
		return b.String()
	}
	levels := r.Levels(len(ents))
	for j, e := range ents {
		l := levels[j]
		switch {
		case l == nil:
			seg(&b, e.GetKey(), e.GetValue())
		case l.ShareThreshold:
			seg(&b, l.Key, l.Value)
		case r.DetailedMetric:
			seg(&b, e.GetKey(), e.GetValue())
		case l.ValueToMetric && (l.Value == "" || l.IsWildcard()):
			seg(&b, e.GetKey(), e.GetValue())
		default:
			seg(&b, l.Key, l.Value)
		}
	}
	return b.String()
}

func seg(b *strings.Builder, key, value string) {
	b.WriteByte('.')
	b.WriteString(key)
	if value != "" {
		b.WriteByte('_')
		b.WriteString(value)
	}
}

// Sanitize makes a key path what the incumbent names it: ':' and '|' (the
// statsd line's separators, which the incumbent replaces too) and control
// characters (which would start a new line) become '_', and so do the
// dots of every IPv4-looking run (four groups of 1-3 digits), wherever it
// is in the path and whatever the rule's shape, so that an address or a
// CIDR stays one statsd level and one Prometheus label
// (masked_remote_address_10_0_0_0/8, gw_edge-10_1_2_3.example) while
// v1.2.3 or api.example.com keep theirs, as the recording has them.
func Sanitize(path string) string {
	if strings.ContainsFunc(path, unsafeRune) {
		path = strings.Map(func(r rune) rune {
			if unsafeRune(r) {
				return '_'
			}
			return r
		}, path)
	}
	if strings.Count(path, ".") < 3 || !ipv4Run.MatchString(path) {
		return path
	}
	return ipv4Run.ReplaceAllStringFunc(path, func(ip string) string { return strings.ReplaceAll(ip, ".", "_") })
}

// ipv4Run is what the incumbent takes for an address in a stat name:
// unanchored, so 1234.5.6.7 loses its dots from the 2 on.
var ipv4Run = regexp.MustCompile(`[0-9]{1,3}\.[0-9]{1,3}\.[0-9]{1,3}\.[0-9]{1,3}`)

func unsafeRune(r rune) bool { return r == ':' || r == '|' || r < ' ' || r == 0x7f }

// Total counts the hits of a descriptor matched to a limit, before it is
// decided (the incumbent's total_hits).
func (c *Counters) Total(hits uint64) {
	if c != nil {
		c.totalHits.Add(hits)
	}
}

// LocalCache counts hits answered over the limit from the local cache.
func (c *Counters) LocalCache(hits uint64) {
	if c != nil {
		c.overLimit.Add(hits)
		c.overLocal.Add(hits)
	}
}

// Decided counts a decision of hits against limit, the counter having
// used before them: over the limit, the hits past it (all of them when
// the counter was full already) and the near-limit hits below it; within,
// the hits and those past the near-limit threshold.
func (c *Counters) Decided(hits, limit, before uint64, over bool) {
	if c == nil {
		return
	}
	near := uint64(math.Floor(float64(limit) * c.nearRatio))
	after := before + hits
	if over {
		if before >= limit {
			c.overLimit.Add(hits)
			return
		}
		c.overLimit.Add(after - limit)
		c.nearLimit.Add(limit - max(near, before))
		return
	}
	if after > near {
		c.nearLimit.Add(after - max(near, before))
	}
	c.withinLimit.Add(hits)
}

// Shadow counts over-limit hits let through by the rule's shadow_mode.
func (c *Counters) Shadow(hits uint64) {
	if c != nil {
		c.shadow.Add(hits)
	}
}

// Request counts one ShouldRateLimit call and its time.
func (s *Stats) Request(d time.Duration) {
	if s == nil {
		return
	}
	s.totalRequests.Inc()
	ms := float64(d) / float64(time.Millisecond)
	s.respTimer.AddValue(ms)
	if s.respObs != nil {
		s.respObs.Observe(ms * s.respScale)
	}
}

// ConfigLoaded counts a rules load.
func (s *Stats) ConfigLoaded(ok bool) {
	switch {
	case s == nil:
	case ok:
		s.configOK.Inc()
	default:
		s.configErr.Inc()
	}
}

// RedisError counts a request the store could not decide.
func (s *Stats) RedisError() {
	if s != nil {
		s.redisErr.Inc()
	}
}

// ServiceError counts a request refused (invalid, or no rules loaded).
func (s *Stats) ServiceError() {
	if s != nil {
		s.serviceErr.Inc()
	}
}

// GlobalShadow counts a request over a limit answered OK by global shadow
// mode.
func (s *Stats) GlobalShadow() {
	if s != nil {
		s.globalShadow.Inc()
	}
}

// DomainNotFound counts a request for a domain no rules define, under
// that domain for the first NameCap domains and not at all past them.
func (s *Stats) DomainNotFound(domain string) {
	if s == nil {
		return
	}
	s.mu.Lock()
	c, ok := s.unknown[domain]
	if !ok && len(s.unknown) < s.opts.NameCap {
		c = s.service.NewCounter("service.rate_limit." + Sanitize(domain) + ".domain_not_found")
		s.unknown[domain] = c
	}
	s.mu.Unlock()
	if c != nil {
		c.Inc()
	}
}
