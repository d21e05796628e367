// Package record is what the service reports, and the interface its
// sinks implement: each descriptor's decision once (a Decision) and each
// request-level event once (an Event), to every Recorder the assembler
// hands the service — ratelimitd's Prometheus metrics
// (internal/metrics) and envoyproxy/ratelimit's stats
// (internal/incumbentstats). The service builds its answer and reports;
// the sinks count, each in its own names.
package record

import (
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"

	"github.com/ratelimitd/ratelimitd/config"
)

// Decision is what one descriptor's decision reports: a descriptor
// decided against a counter (Counted), or an unlimited one.
type Decision struct {
	Domain, Label string
	Rule          *config.Rule
	Entries       []*rlcommon.RateLimitDescriptor_Entry
	Hits          uint64
	// Counted: decided against a counter; false for an unlimited rule.
	Counted bool
	// Refund: the descriptor gave hits back (is_negative_hits).
	Refund bool
	// HitsResult is ratelimitd_hits_total's result for the hits: what
	// became of them in the store (empty for a refund).
	HitsResult string
	// Outcome is the decision's reason (ratelimitd_decisions_total's
	// outcome); Shadow says it is a shadow rule's over-limit let through.
	Outcome string
	Shadow  bool
	// Cached: answered by the local cache. Stored: decided by the store,
	// with the counter's Limit, its use Before these hits, and whether
	// they were Over (before shadow mode made the answer OK).
	Cached, Stored bool
	Limit, Before  uint64
	Over           bool
}

// Kind is a request-level event's kind.
type Kind uint8

// The request-level events.
const (
	// Request: a request decided, with its overall Code and Duration.
	Request Kind = iota
	// Invalid: a request refused as malformed.
	Invalid
	// NoRules: a request that came before any rules were loaded.
	NoRules
	// UnknownDomain: a request for a Domain no rules define.
	UnknownDomain
	// Canceled: the caller went away before the store decided.
	Canceled
	// StoreError: the store could not decide (the failure policy
	// answered).
	StoreError
	// GlobalShadow: a request over a limit answered OK by global shadow
	// mode.
	GlobalShadow
	// Hits: hits of a descriptor counted apart from its decision (a
	// request canceled after the store may have recorded them): Label,
	// HitsResult and Hits, under Domain.
	Hits
)

// Event is a request-level event: Kind, and what that kind carries.
type Event struct {
	Kind       Kind
	Domain     string
	Code       string
	Duration   time.Duration
	Label      string
	HitsResult string
	Hits       uint64
}

// DefaultNearLimitRatio is the share of a limit from which an OK
// decision counts as near the limit (--near-limit-ratio):
// envoyproxy/ratelimit's NEAR_LIMIT_RATIO default, ratelimitd's too.
const DefaultNearLimitRatio = 0.8

// Recorder counts what the service reports.
type Recorder interface {
	Record(d Decision)
	Event(e Event)
}

// RulesUser is a Recorder that counts under the rules in force: the
// service tells it of each snapshot as it puts it in force, before the
// requests that use it.
type RulesUser interface {
	UseRules(snap *config.Snapshot)
}
