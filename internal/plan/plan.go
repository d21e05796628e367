// Package plan is the vocabulary of a descriptor's plan that the
// service shares with the RLQS server: how one descriptor is limited
// (Bucket), and the demand RLS callers put on the counters RLQS buckets
// draw on (Demand). The service makes plans; rlqs hands out budget by
// them.
package plan

import (
	"github.com/ratelimitd/ratelimitd/config"
	"github.com/ratelimitd/ratelimitd/internal/limit"
)

// Kind says how a single descriptor is limited.
type Kind uint8

// The kinds.
const (
	// NoRule: no rule matches, or the rule has no limit (or the
	// domain is unknown): nothing limits it, as for ShouldRateLimit.
	NoRule Kind = iota
	// Unlimited: the rule says `unlimited: true`.
	Unlimited
	// Shadow: the rule (or --shadow-mode) is in shadow mode: it
	// is never denied.
	Shadow
	// Counted: decided on Check's counter.
	Counted
)

// String names the kind for logs and metrics.
func (k Kind) String() string {
	switch k {
	case Unlimited:
		return "unlimited"
	case Shadow:
		return "shadow"
	case Counted:
		return "counted"
	}
	return "no_rule"
}

// Bucket is how one descriptor is limited, for callers that hand out
// budget ahead of requests (RLQS) instead of asking per request.
type Bucket struct {
	Kind Kind
	// Check is the counter of a Counted plan: the key, limit,
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
