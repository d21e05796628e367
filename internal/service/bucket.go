package service

import (
	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/ratelimitd/ratelimitd/config"
	"github.com/ratelimitd/ratelimitd/internal/limit"
)

// BucketKind says how a single descriptor is limited.
type BucketKind uint8

// The bucket kinds.
const (
	// BucketNoRule: no rule matches, or the rule has no limit (or the
	// domain is unknown): nothing limits it, as for ShouldRateLimit.
	BucketNoRule BucketKind = iota
	// BucketUnlimited: the rule says `unlimited: true`.
	BucketUnlimited
	// BucketShadow: the rule (or --shadow-mode) is in shadow mode: it
	// is never denied.
	BucketShadow
	// BucketCounted: decided on Check's counter.
	BucketCounted
)

// String names the kind for logs and metrics.
func (k BucketKind) String() string {
	switch k {
	case BucketUnlimited:
		return "unlimited"
	case BucketShadow:
		return "shadow"
	case BucketCounted:
		return "counted"
	}
	return "no_rule"
}

// BucketPlan is how one descriptor is limited, for callers that hand
// out budget ahead of requests (RLQS) instead of asking per request.
type BucketPlan struct {
	Kind BucketKind
	// Check is the counter of a BucketCounted plan: the key, limit,
	// window and algorithm ShouldRateLimit decides the same descriptor
	// on, with Hits zero.
	Check limit.Check
	// Failure is how to answer when the store cannot decide: the rule's
	// failure_mode, else the service's.
	Failure config.FailureMode
	// Rule labels the rule in metrics: its limit's name, else its path
	// ("" without a rule).
	Rule string
}

// PlanBucket matches the descriptor ents of domain as ShouldRateLimit
// does and returns its plan; RLQS buckets so share the counters of RLS
// callers of the same rules. ErrNoRules while no rules are in force. The
// caller bounds ents (they are matched, never stored).
func (s *Service) PlanBucket(domain string, ents []*rlcommon.RateLimitDescriptor_Entry) (BucketPlan, error) {
	return s.PlanBucketIn(s.rules.Load(), domain, ents)
}

// PlanBucketIn is PlanBucket on the snapshot rules (one a caller read
// already, so that what it read of the domain and the plan agree), nil
// for none.
func (s *Service) PlanBucketIn(rules *config.Snapshot, domain string, ents []*rlcommon.RateLimitDescriptor_Entry) (BucketPlan, error) {
	if rules == nil {
		return BucketPlan{}, ErrNoRules
	}
	req := &rlsv3.RateLimitRequest{Domain: domain, Descriptors: []*rlcommon.RateLimitDescriptor{{Entries: ents}}}
	items := make([]item, 1)
	s.plan(req, rules.Domain(domain), items)
	it := &items[0]
	p := BucketPlan{Failure: it.failure, Rule: it.label}
	if p.Failure == config.FailureUnset {
		p.Failure = s.opts.FailureMode
	}
	switch {
	case it.kind == noLimit:
		p.Kind = BucketNoRule
	case it.kind == unlimited:
		p.Kind = BucketUnlimited
	case it.shadow || s.opts.ShadowMode:
		p.Kind = BucketShadow
	default:
		p.Kind = BucketCounted
		enc := encoders.Get().(*limit.Encoder)
		key := s.counterKey(enc, domain, ents, it)
		encoders.Put(enc)
		p.Check = limit.Check{Key: key, Limit: it.rpu, WindowUS: it.windowUS, Algorithm: it.algo, Burst: it.burst}
	}
	return p, nil
}
