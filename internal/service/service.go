// Package service decides Envoy RateLimitService requests: it validates a
// request, matches each descriptor against the rules snapshot in force,
// plans one counter per limited descriptor, answers counters known
// exhausted from the local over-limit cache, and has the store decide the
// rest in one atomic evaluation. It knows nothing of gRPC or HTTP.
package service

import (
	"context"
	"errors"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/ratelimitd/ratelimitd/internal/fielderr"
	"github.com/ratelimitd/ratelimitd/internal/plan"
	"github.com/ratelimitd/ratelimitd/internal/record"

	"github.com/ratelimitd/ratelimitd/config"
	"github.com/ratelimitd/ratelimitd/internal/limit"
	"github.com/ratelimitd/ratelimitd/internal/lograte"
)

// Store evaluates one request's checks atomically and returns one Result
// per check, in order.
type Store interface {
	Evaluate(ctx context.Context, checks []limit.Check) ([]limit.Result, error)
}

// Cache remembers counters known exhausted, under a given limit, until a
// given local time.
type Cache interface {
	Blocked(key string, limit uint64, now time.Time) (until time.Time, ok bool)
	Block(key string, limit uint64, until, now time.Time)
	Forget(key string)
	Clear()
}

// ErrInvalidRequest marks a request the service refuses to decide: empty
// domain, no descriptors, or beyond the size bounds. The transports map it
// to gRPC InvalidArgument and HTTP 400.
var ErrInvalidRequest = errors.New("invalid request")

// ErrNoRules is returned while no rules snapshot is in force.
var ErrNoRules = errors.New("no rate limit rules loaded")

// Defaults of the request bounds in [Options].
const (
	DefaultMaxDescriptors = 64
	DefaultMaxEntries     = 32
	DefaultMaxEntryBytes  = 4096
	// DefaultDeadlineMargin leaves time to answer before a caller's
	// deadline (Envoy's filter timeout is 20ms by default).
	DefaultDeadlineMargin = 2 * time.Millisecond
	// DefaultUsageTimeout outlasts an LLM response streamed for minutes.
	DefaultUsageTimeout = 5 * time.Minute
)

// Options configures a [Service]. The zero value is usable.
type Options struct {
	// KeyPrefix starts every counter key (e.g. "prod:"); changing it
	// starts every counter afresh.
	KeyPrefix string
	// ShadowMode decides and reports every descriptor as usual but always
	// answers the overall code OK.
	ShadowMode bool
	// ResponseHeaders selects the rate-limit headers of the most
	// constraining descriptor: none (zero), legacy or draft-11. Rejected
	// requests also get Retry-After.
	ResponseHeaders HeaderStyle
	// HeaderNames renames the legacy style's three headers (as
	// envoyproxy/ratelimit's LIMIT_*_HEADER do); an empty name keeps
	// the default.
	HeaderNames HeaderNames
	// MaxDescriptors bounds the descriptors of one request. Zero means
	// DefaultMaxDescriptors.
	MaxDescriptors int
	// MaxEntries bounds the entries of one descriptor. Zero means
	// DefaultMaxEntries.
	MaxEntries int
	// MaxEntryBytes bounds each entry's key and value, in bytes. Zero
	// means DefaultMaxEntryBytes.
	MaxEntryBytes int
	// FailureMode answers the descriptors whose rule sets no failure_mode
	// when the store cannot decide. Zero means config.FailureAllow.
	FailureMode config.FailureMode
	// DeadlineMargin is kept free of a caller's deadline for answering:
	// the store call must end that long before the caller gives up. Zero
	// means DefaultDeadlineMargin.
	DeadlineMargin time.Duration
	// NearLimitRatio marks an OK decision near_limit in metrics when the
	// counter reaches this share of its limit. Zero means
	// record.DefaultNearLimitRatio.
	NearLimitRatio float64
	// DecisionMetadata explains every decision in the response's
	// dynamic_metadata: {"decisions": [{"rule": ..., "reason": ...}, ...]},
	// one entry per descriptor in request order. Envoy stores it under
	// the filter's metadata namespace, for access logs.
	DecisionMetadata bool
	// CarryIncumbent gives each fixed-window counter (not a calendar
	// period, a unit_multiplier or a lease) envoyproxy/ratelimit's key for
	// it (limit.Check.Incumbent), so that the store starts it from the
	// incumbent's count (--carry-incumbent-counts).
	CarryIncumbent bool
	// ResponseMetadata returns envoyproxy/ratelimit's
	// RESPONSE_DYNAMIC_METADATA answer in the response's dynamic_metadata
	// (see incumbentMetadata); beside DecisionMetadata's "decisions" in
	// the same Struct, whose fields it does not share.
	ResponseMetadata bool
	// DetailedMetricCap bounds the distinct request values each
	// detailed_metric rule adds to metric labels. Zero means
	// DefaultDetailedMetricCap.
	DetailedMetricCap int
	// RejectedHits is what a refused call consumes under a rule that sets
	// no rejected_hits (every rule that arrives over xDS). Zero means
	// config.RejectedUsage: a call that states its hits is a usage charge,
	// recorded even when refused.
	RejectedHits config.RejectedHits
	// UsageTimeout is how long a budget check (a call stating 0 hits)
	// counts as in flight while its usage charge has not come. Zero means
	// DefaultUsageTimeout.
	UsageTimeout time.Duration
	// NoBudgets reads no call as a budget check (--budgets off): a call
	// stating 0 hits is a read, one stating 1 or none a request, and a
	// stream end's hits a charge recorded whatever, never a budget's.
	NoBudgets bool
	// CalendarPeriods makes the month and year windows of rules that do
	// not set calendar (every rule over xDS) UTC calendar months and
	// years, where a rule can be one (config.RateLimit.CalendarEligible,
	// outside domains served over RLQS). Off: 30 and 365 days from the
	// epoch, as envoyproxy/ratelimit counts them.
	CalendarPeriods bool
	// Traced says a caller may have started a span in the request's
	// context (the server's tracing is on): only then is the decision
	// described on it. Off, the request pays no context lookup for it.
	Traced bool
	// Recorders are told each descriptor's decision and each
	// request-level event, once each (internal/record): the assembler
	// hands in ratelimitd's metrics and envoyproxy/ratelimit's stats.
	// Nil counts nothing.
	Recorders []record.Recorder
	// Logger receives fail-open warnings (at most one a second) and, at
	// debug level, one line per request. Nil discards.
	Logger *slog.Logger
	// Now is the service's clock, used only for local over-limit cache
	// deadlines derived from durations the store returned; windows come
	// from the store's clock. Nil means time.Now.
	Now func() time.Time
}

// Validate refuses options no service can run with, naming the field.
// Zero values stand for the defaults.
func (o Options) Validate() error {
	for _, h := range []struct{ field, v string }{{"HeaderNames.Limit", o.HeaderNames.Limit},
		{"HeaderNames.Remaining", o.HeaderNames.Remaining}, {"HeaderNames.Reset", o.HeaderNames.Reset}} {
		if h.v != "" && !ValidHeaderName(h.v) {
			return fielderr.Errorf("service", h.field, "%q: not an HTTP header name", h.v)
		}
	}
	switch {
	case o.NearLimitRatio < 0 || o.NearLimitRatio > 1:
		return fielderr.Errorf("service", "NearLimitRatio", "%v: want in (0, 1]", o.NearLimitRatio)
	case o.UsageTimeout != 0 && (o.UsageTimeout < time.Second || o.UsageTimeout > 24*time.Hour || o.UsageTimeout%time.Second != 0):
		return fielderr.Errorf("service", "UsageTimeout", "%v: want whole seconds from 1s to 24h", o.UsageTimeout)
	case o.DeadlineMargin < 0:
		return fielderr.Errorf("service", "DeadlineMargin", "%v: want positive", o.DeadlineMargin)
	}
	return nil
}

// Service answers rate-limit requests. It is safe for concurrent use.
type Service struct {
	rules atomic.Pointer[config.Snapshot]
	store Store
	cache Cache
	opts  Options
	log   *slog.Logger
	now   func() time.Time

	detailed detailedLabels
	// recorders are told each decision and event (recorder.go).
	recorders []record.Recorder

	demand      plan.Demand
	lastFailLog lograte.Limiter // of the fail-open log line
	flightS     int64           // opts.UsageTimeout in seconds, as checks carry it
}

// New returns a service deciding with rules (which may be nil until
// [Service.SetRules]), store and, when cache is not nil, a local
// over-limit cache.
func New(rules *config.Snapshot, store Store, cache Cache, opts Options) *Service {
	if opts.MaxDescriptors <= 0 {
		opts.MaxDescriptors = DefaultMaxDescriptors
	}
	if opts.MaxEntries <= 0 {
		opts.MaxEntries = DefaultMaxEntries
	}
	if opts.MaxEntryBytes <= 0 {
		opts.MaxEntryBytes = DefaultMaxEntryBytes
	}
	if opts.FailureMode == config.FailureUnset {
		opts.FailureMode = config.FailureAllow
	}
	if opts.DetailedMetricCap <= 0 {
		opts.DetailedMetricCap = DefaultDetailedMetricCap
	}
	if opts.DeadlineMargin <= 0 {
		opts.DeadlineMargin = DefaultDeadlineMargin
	}
	if opts.RejectedHits == config.RejectedUnset {
		opts.RejectedHits = config.RejectedUsage
	}
	if opts.UsageTimeout <= 0 {
		opts.UsageTimeout = DefaultUsageTimeout
	}
	opts.HeaderNames = opts.HeaderNames.withDefaults()
	if opts.NearLimitRatio <= 0 || opts.NearLimitRatio > 1 {
		opts.NearLimitRatio = record.DefaultNearLimitRatio
	}
	s := &Service{store: store, cache: cache, opts: opts, log: opts.Logger, now: opts.Now, recorders: opts.Recorders}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	if s.now == nil {
		s.now = time.Now
	}
	s.detailed.cap = opts.DetailedMetricCap
	s.flightS = int64(opts.UsageTimeout / time.Second)
	s.useRules(rules)
	s.rules.Store(rules)
	return s
}

// Demand counts the hits asked for on the counters it watches.
func (s *Service) Demand() *plan.Demand { return &s.demand }

// SetRules puts a new snapshot in force for the requests that start after
// it returns, and empties the over-limit cache: a changed limit makes its
// entries suspect.
func (s *Service) SetRules(rules *config.Snapshot) {
	s.useRules(rules)
	s.rules.Store(rules)
	s.detailed.reset()
	if s.cache != nil {
		s.cache.Clear()
	}
}

// Rules returns the snapshot in force.
func (s *Service) Rules() *config.Snapshot { return s.rules.Load() }
