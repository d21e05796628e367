package service

import (
	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/ratelimitd/ratelimitd/config"
	"github.com/ratelimitd/ratelimitd/internal/limit"
	"github.com/ratelimitd/ratelimitd/internal/plan"
)

// PlanBucket matches the descriptor ents of domain as ShouldRateLimit
// does and returns its plan; RLQS buckets so share the counters of RLS
// callers of the same rules. ErrNoRules while no rules are in force. The
// caller bounds ents (they are matched, never stored).
func (s *Service) PlanBucket(domain string, ents []*rlcommon.RateLimitDescriptor_Entry) (plan.Bucket, error) {
	return s.PlanBucketIn(s.rules.Load(), domain, ents)
}

// PlanBucketIn is PlanBucket on the snapshot rules (one a caller read
// already, so that what it read of the domain and the plan agree), nil
// for none.
func (s *Service) PlanBucketIn(rules *config.Snapshot, domain string, ents []*rlcommon.RateLimitDescriptor_Entry) (plan.Bucket, error) {
	if rules == nil {
		return plan.Bucket{}, ErrNoRules
	}
	req := &rlsv3.RateLimitRequest{Domain: domain, Descriptors: []*rlcommon.RateLimitDescriptor{{Entries: ents}}}
	items := make([]item, 1)
	s.plan(req, rules.Domain(domain), items)
	it := &items[0]
	p := plan.Bucket{Failure: it.failure, Rule: it.label}
	if p.Failure == config.FailureUnset {
		p.Failure = s.opts.FailureMode
	}
	switch {
	case it.kind == noLimit:
		p.Kind = plan.NoRule
	case it.kind == unlimited:
		p.Kind = plan.Unlimited
	case it.shadow || s.opts.ShadowMode:
		p.Kind = plan.Shadow
	default:
		p.Kind = plan.Counted
		enc := encoders.Get().(*limit.Encoder)
		key := s.counterKey(enc, domain, ents, it)
		encoders.Put(enc)
		p.Check = limit.Check{Key: key, Limit: it.rpu, WindowUS: it.windowUS, Algorithm: it.algo, Burst: it.burst}
	}
	return p, nil
}
