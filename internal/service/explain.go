package service

import (
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/ratelimitd/ratelimitd/config"
)

// Explanation says what the service does with one descriptor of a
// request: the rule it matches and what becomes of the rule's limit.
type Explanation struct {
	// Rule is the matching rule, nil when none matches.
	Rule *config.Rule
	// Outcome is ExplainLimited, OutcomeUnlimited, ReasonNoRule (no rule,
	// a rule without a limit, or an unknown domain) or ReasonReplaced.
	Outcome string
	// ReplacedBy is the path of the rule, matched by another descriptor of
	// the request, whose limit replaced this one's.
	ReplacedBy string
	// Override is set when the descriptor carries its own limit.
	Override bool
}

// ExplainLimited is the outcome of a descriptor decided on a counter.
const ExplainLimited = "limited"

// Explain matches req against rules exactly as ShouldRateLimit does —
// matching, replaces, overrides — without deciding anything: what a
// person editing the rules wants to know of a request. Errors are
// ErrInvalidRequest.
func Explain(rules *config.Snapshot, req *rlsv3.RateLimitRequest) ([]Explanation, error) {
	s := New(rules, nil, nil, Options{})
	if err := s.validate(req); err != nil {
		return nil, err
	}
	dom := rules.Domain(req.GetDomain())
	items := make([]item, len(req.GetDescriptors()))
	s.plan(req, dom, items)
	out := make([]Explanation, len(items))
	for i := range items {
		it := &items[i]
		e := &out[i]
		e.Rule, e.Override = it.rule, it.override
		if e.Rule == nil && !it.override && dom != nil {
			// A rule without a limit matches but plans nothing: still,
			// it is the rule the descriptor reaches.
			e.Rule = dom.Match(req.GetDescriptors()[i].GetEntries())
		}
		switch {
		case it.replaced:
			e.Outcome = ReasonReplaced
			for j := range items {
				if r := items[j].rule; r != nil && r.Limit != nil && !items[j].replaced {
					for _, name := range r.Limit.Replaces {
						if name == it.name {
							e.ReplacedBy = r.Path
						}
					}
				}
			}
		case it.kind == unlimited:
			e.Outcome = OutcomeUnlimited
		case it.kind == counted:
			e.Outcome = ExplainLimited
		default:
			e.Outcome = ReasonNoRule
		}
	}
	return out, nil
}
