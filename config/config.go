package config

import (
	"fmt"
	"sort"
	"strings"
	"time"

	"google.golang.org/protobuf/types/known/structpb"
)

// RateLimit is the limit a rule applies.
type RateLimit struct {
	// Name identifies the limit for `replaces`, response names and metrics.
	Name string
	// Unit is the window unit; UnitUnknown when Unlimited.
	Unit Unit
	// RequestsPerUnit is the number of hits allowed per window. Zero
	// rejects every hit. Rules files allow up to MaxRequestsPerUnit on a
	// fixed window, 2^32-1 on the others; rules over xDS carry a uint32.
	RequestsPerUnit uint64
	// Unlimited rules answer OK without touching the store.
	Unlimited bool
	// Replaces lists the names of limits this one removes from a request.
	Replaces []string
	// Algorithm decides the counter: AlgorithmFixedWindow (the default),
	// AlgorithmSlidingWindow or AlgorithmTokenBucket.
	Algorithm Algorithm
	// UnitMultiplier makes the window UnitMultiplier units long; 1 when
	// the file does not say.
	UnitMultiplier uint32
	// Burst is a token bucket's capacity; 0 means RequestsPerUnit.
	Burst uint32
	// Lease has instances decide the limit in process from hits leased
	// from the store's counter (grants), never more than the limit in
	// all; a store with one process decides it exactly.
	Lease bool
	// Global makes the limit one across regions: each instance decides it
	// in process from grants drawn from the home Redis (--global-redis-url),
	// which never hands out more than the limit in all; without a home it
	// is an ordinary limit. A fixed window, neither leased nor a usage
	// budget.
	Global bool
	// RejectedHits says what a refused call consumes; RejectedUnset
	// defers to the service's --rejected-hits.
	RejectedHits RejectedHits
	// Calendar makes a month or year window the UTC calendar month or
	// year instead of 30 or 365 days from the epoch; CalendarSet says
	// the file chose (else the service's --calendar-periods does).
	Calendar, CalendarSet bool
}

// CalendarEligible reports whether the limit can be a calendar period: a
// fixed window of one month or one year, not leased (grants count
// windows of fixed length).
func (l *RateLimit) CalendarEligible() bool {
	return (l.Unit == UnitMonth || l.Unit == UnitYear) && l.UnitMultiplier <= 1 &&
		l.Algorithm == AlgorithmFixedWindow && !l.Lease && !l.Global && !l.Unlimited
}

// RejectedHits says what a refused call consumes of a limit.
type RejectedHits uint8

// The choices of rejected_hits. The zero value defers to the service.
const (
	RejectedUnset RejectedHits = iota
	// RejectedUsage records the hits of a call that states them (a
	// descriptor's hits_addend, or the request's): usage reported after
	// the fact, such as an LLM response's tokens, is charged even when
	// it crosses the limit or the call is refused. A call that states no
	// hits (1 by default) is a request, and refused it consumes nothing.
	// A call stating 0 hits is a budget check.
	RejectedUsage
	// RejectedNothing keeps every refused call from consuming anything.
	RejectedNothing
)

// ParseRejectedHits parses "usage" or "nothing".
func ParseRejectedHits(s string) (RejectedHits, error) {
	switch s {
	case "usage":
		return RejectedUsage, nil
	case "nothing":
		return RejectedNothing, nil
	}
	return RejectedUnset, fmt.Errorf("unknown rejected_hits %q (want usage or nothing)", s)
}

// String returns the name used in rules files.
func (r RejectedHits) String() string {
	switch r {
	case RejectedUsage:
		return "usage"
	case RejectedNothing:
		return "nothing"
	}
	return "unset"
}

// Window is the length of one window: the unit times the multiplier.
func (l *RateLimit) Window() time.Duration {
	return l.Unit.Duration() * time.Duration(max(l.UnitMultiplier, 1))
}

// Algorithm names how a limit decides. Values match limit.Algorithm.
type Algorithm uint8

// The algorithms of the rules format.
const (
	AlgorithmFixedWindow   Algorithm = 0
	AlgorithmSlidingWindow Algorithm = 1
	AlgorithmTokenBucket   Algorithm = 2
)

var algorithmNames = []string{"fixed_window", "sliding_window", "token_bucket"}

// String returns the name used in rules files.
func (a Algorithm) String() string {
	if int(a) < len(algorithmNames) {
		return algorithmNames[a]
	}
	return "unknown"
}

// Rule is one descriptor node of a domain's tree. Rules are immutable once
// compiled into a [Snapshot].
type Rule struct {
	Key   string
	Value string // empty for a key-only rule
	// Limit is nil for a node that only groups children (or whitelists).
	Limit      *RateLimit
	ShadowMode bool
	QuotaMode  bool
	// FailureMode is how the rule is answered when the store cannot
	// decide; FailureUnset defers to the service's global mode.
	FailureMode    FailureMode
	DetailedMetric bool
	ValueToMetric  bool
	// ShareThreshold makes every value matching a wildcard share one counter.
	ShareThreshold bool
	// RequestID makes this key-only level's value the request's id
	// (Envoy's x-request-id): not part of the counter, it pairs a token
	// budget's check with its stream end (limit.Check.PairID).
	RequestID bool
	// Metadata is the rule's free-form `metadata` map, as the Struct the
	// response's dynamic metadata returns (--response-dynamic-metadata):
	// checked at load, so that a request never meets one that cannot be.
	Metadata *structpb.Struct

	// Path is the stats path: domain, then key or key_value per level,
	// joined with '.', as envoyproxy/ratelimit names it.
	Path string
	// File and Line locate the rule in the rules files.
	File string
	Line int

	parent   *Rule
	depth    int // 1 for a top-level rule
	wildcard []string
	children *level
}

// FailureMode says how a rule is answered when the store cannot decide.
type FailureMode uint8

// The failure modes. The zero value defers to the global mode.
const (
	FailureUnset FailureMode = iota
	// FailureAllow answers OK (fail open): right for browsing, where an
	// outage of the limiter must not become an outage of the site.
	FailureAllow
	// FailureDeny answers OVER_LIMIT (fail closed): right for logins and
	// one-time codes, where an unlimited window is an attack window.
	FailureDeny
)

// ParseFailureMode parses "allow" or "deny".
func ParseFailureMode(s string) (FailureMode, error) {
	switch s {
	case "allow":
		return FailureAllow, nil
	case "deny":
		return FailureDeny, nil
	}
	return FailureUnset, fmt.Errorf("unknown failure_mode %q (want allow or deny)", s)
}

// String returns the name used in rules files.
func (f FailureMode) String() string {
	switch f {
	case FailureAllow:
		return "allow"
	case FailureDeny:
		return "deny"
	}
	return "unset"
}

// PathSegment is one level of a rule's Path: key, or key_value.
func PathSegment(key, value string) string {
	if value == "" {
		return key
	}
	return key + "_" + value
}

// Parent returns the rule one level up, or nil for a top-level rule.
func (r *Rule) Parent() *Rule { return r.parent }

// Levels returns the rules matched at each of a descriptor's n entries,
// r being the one at its last: entry j was matched by Levels(n)[j], nil
// for the entries past the depth of r's ancestry.
func (r *Rule) Levels(n int) []*Rule {
	levels := make([]*Rule, n)
	for l, j := r, n-1; l != nil && j >= 0; l, j = l.parent, j-1 {
		levels[j] = l
	}
	return levels
}

// Depth returns the rule's level, 1 for a top-level rule.
func (r *Rule) Depth() int { return r.depth }

// IsWildcard reports whether the rule's value is a pattern with '*'.
func (r *Rule) IsWildcard() bool { return r.wildcard != nil }

// Domain is the compiled rules of one domain.
type Domain struct {
	Name string
	// ConfigName is the document's top-level name (a RateLimitConfig's
	// name, as generators write it), "" when it has none.
	ConfigName string
	File       string
	// Line is where its domain field is in File (0: not known).
	Line int
	// RLQSKeys are rlqs.descriptor_keys: the bucket id keys whose values,
	// in this order, make an RLQS bucket's descriptor (nil: the domain
	// limits no RLQS bucket).
	RLQSKeys []string
	root     *level
	// rules in file order, depth first, for dumps.
	rules []*Rule
}

// Rules returns the domain's rules in file order, depth first.
func (d *Domain) Rules() []*Rule { return d.rules }

// Snapshot is one complete, validated set of rules. It is never modified
// after [Load] returns it, so request handlers may share it freely.
type Snapshot struct {
	domains map[string]*Domain
	// Files are the rules files that were loaded, in load order.
	Files []string
	// Hash is a hex SHA-256 over the files' contents and their names
	// relative to the rules root (a file's base name), the same however
	// the rules path is spelled.
	Hash string
	// LoadedAt is when the snapshot was built.
	LoadedAt time.Time
}

// Domain returns the named domain, or nil when no file defines it.
func (s *Snapshot) Domain(name string) *Domain {
	if s == nil {
		return nil
	}
	return s.domains[name]
}

// GetHash returns the snapshot's hash, or "" for a nil snapshot.
func (s *Snapshot) GetHash() string {
	if s == nil {
		return ""
	}
	return s.Hash
}

// Domains returns the domain names, sorted.
func (s *Snapshot) Domains() []string {
	names := make([]string, 0, len(s.domains))
	for n := range s.domains {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// Dump renders the rules in force, one line per limited rule, sorted by
// domain and file order, for /rlconfig.
func (s *Snapshot) Dump() string {
	var b strings.Builder
	for _, name := range s.Domains() {
		for _, r := range s.domains[name].rules {
			if r.Limit == nil {
				continue
			}
			l := r.Limit
			if l.Unlimited {
				fmt.Fprintf(&b, "%s: unlimited", r.Path)
			} else {
				fmt.Fprintf(&b, "%s: unit=%s requests_per_unit=%d", r.Path, l.Unit, l.RequestsPerUnit)
				if l.UnitMultiplier > 1 {
					fmt.Fprintf(&b, " unit_multiplier=%d", l.UnitMultiplier)
				}
				if l.Algorithm != AlgorithmFixedWindow {
					fmt.Fprintf(&b, " algorithm=%s", l.Algorithm)
				}
				if l.Burst > 0 {
					fmt.Fprintf(&b, " burst=%d", l.Burst)
				}
				if l.Lease {
					b.WriteString(" lease=true")
				}
				if l.Global {
					b.WriteString(" global=true")
				}
			}
			if l.Name != "" {
				fmt.Fprintf(&b, " name=%q", l.Name)
			}
			fmt.Fprintf(&b, " shadow_mode=%t quota_mode=%t", r.ShadowMode, r.QuotaMode)
			if r.FailureMode != FailureUnset {
				fmt.Fprintf(&b, " failure_mode=%s", r.FailureMode)
			}
			if r.Line > 0 {
				fmt.Fprintf(&b, " (%s:%d)\n", r.File, r.Line)
			} else {
				fmt.Fprintf(&b, " (%s)\n", r.File)
			}
		}
	}
	return b.String()
}

// level holds the rules of one depth under one parent, indexed by key.
type level struct {
	byKey map[string]*keyRules
}

type keyRules struct {
	exact     map[string]*Rule
	wildcards []*Rule // file order: the first match wins
	def       *Rule   // the key-only rule
}

// MinRLQSWindow is the shortest window check-config accepts without a
// warning for a rule RLQS buckets reach: Envoy reports every 5 s and
// assignments last whole seconds ending before the window does, so a
// shorter window is mostly spent denying (see docs/ARCHITECTURE.md).
const MinRLQSWindow = 10 * time.Second

// RLQSRule reports whether RLQS buckets can reach r: its domain has
// rlqs.descriptor_keys and r's keys, from the top, are a prefix of them.
func (d *Domain) RLQSRule(r *Rule) bool {
	if len(d.RLQSKeys) < r.depth {
		return false
	}
	for n := r; n != nil; n = n.parent {
		if d.RLQSKeys[n.depth-1] != n.Key {
			return false
		}
	}
	return true
}

// Warnings returns what loads but is likely not what was meant, one line
// each with the rule's file and line: limits that RLQS buckets reach with
// a window under MinRLQSWindow, and limits on a key-only level named like
// a request id without request_id (each request its own counter).
func (s *Snapshot) Warnings() []string {
	var out []string
	for _, name := range s.Domains() {
		d := s.Domain(name)
		for _, r := range d.rules {
			if r.Limit != nil && !r.Limit.Unlimited && r.Value == "" && !r.RequestID && looksLikeRequestID(r.Key) {
				out = append(out, fmt.Sprintf("%s:%d: %s: warning: a limit on every value of %q counts each request on its own counter, so it never limits anything; if %q is the request's id, mark the level request_id: true (docs/token-budgets.md, \"Pairing a check with its stream end\")",
					r.File, r.Line, r.Path, r.Key, r.Key))
			}
		}
		if d.RLQSKeys == nil {
			continue
		}
		for _, r := range d.rules {
			l := r.Limit
			if l == nil || l.Unlimited || !d.RLQSRule(r) {
				continue
			}
			if w := l.Window(); w < MinRLQSWindow {
				out = append(out, fmt.Sprintf("%s:%d: %s: warning: RLQS buckets reach this %s window; under %s, Envoy's 5 s reports and whole-second assignments leave most of each window denied",
					r.File, r.Line, r.Path, w, MinRLQSWindow))
			}
		}
	}
	return out
}

// GlobalRules returns the limits marked global (rate_limit.global, or
// made so by --global-domains), one "file:line: path" each: one limit
// across regions only where the server draws them from a home Redis.
func (s *Snapshot) GlobalRules() []string {
	var out []string
	for _, name := range s.Domains() {
		for _, r := range s.Domain(name).rules {
			if r.Limit != nil && r.Limit.Global {
				out = append(out, fmt.Sprintf("%s:%d: %s", r.File, r.Line, r.Path))
			}
		}
	}
	return out
}

// looksLikeRequestID reports a descriptor key named as a request's id
// (x-request-id, request_id, requestId, ...).
func looksLikeRequestID(key string) bool {
	k := strings.NewReplacer("-", "", "_", "").Replace(strings.ToLower(key))
	return strings.HasSuffix(k, "requestid")
}
