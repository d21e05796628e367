// Package rlqs serves Envoy's Rate Limit Quota Service
// (envoy.service.rate_limit_quota.v3, --rlqs, preview): Envoys report
// usage per bucket and enforce assignments locally, and the assignments
// are grants (see internal/lease) taken from the very counters
// ShouldRateLimit decides on. A grant is handed to an Envoy as a fresh
// token bucket holding exactly the grant, refilling less than one token
// over its TTL, and expiring before the window it was taken in ends; so
// a fleet of Envoys configured strictly (DENY_ALL before an assignment
// and once one expires) never admits more than a rule's limit in a
// window, whatever its size or skew, RLS callers of the same rule
// included. docs/ARCHITECTURE.md gives the bound and what Envoy's
// permissive defaults cost.
package rlqs

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ratelimitd/ratelimitd/internal/fielderr"
	"github.com/ratelimitd/ratelimitd/internal/plan"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"google.golang.org/grpc"

	"github.com/ratelimitd/ratelimitd/config"
	"github.com/ratelimitd/ratelimitd/internal/limit"
)

// ReportPeriod is how often Envoy reports each bucket: its filter ignores
// the configured reporting_interval and reports every 5 s.
const ReportPeriod = 5 * time.Second

// Defaults of [Options].
const (
	DefaultMaxStreams       = 1000
	DefaultMaxBuckets       = 1000
	DefaultMaxBucketIDBytes = 4096
	DefaultMargin           = time.Second
	DefaultIdleAfter        = time.Minute
	DefaultFailureTTL       = 2 * ReportPeriod
	DefaultAllowTTL         = time.Minute
	// MaxBucketIDEntries bounds a bucket id's pairs, as a descriptor's
	// entries are bounded.
	MaxBucketIDEntries = config.MaxRLQSKeys
)

// Planner matches a bucket's descriptor to its rule (service.Service).
type Planner interface {
	Rules() *config.Snapshot
	PlanBucketIn(rules *config.Snapshot, domain string, ents []*rlcommon.RateLimitDescriptor_Entry) (plan.Bucket, error)
	// Demand counts ShouldRateLimit's hits on the counters buckets
	// draw on, for the RLS callers' share.
	Demand() *plan.Demand
}

// Granter takes and gives back grants (redisstore.Store, memstore.Store).
type Granter interface {
	Grant(ctx context.Context, ops []limit.GrantOp) ([]limit.GrantResult, error)
}

// Options configures a [Server]. The zero value is usable.
type Options struct {
	// MaxStreams bounds the open streams; one more is refused with
	// RESOURCE_EXHAUSTED. Zero means DefaultMaxStreams.
	MaxStreams int
	// MaxBuckets bounds the buckets of one stream, and so the bucket
	// reports of one message; a bucket beyond it gets no assignment.
	// Zero means DefaultMaxBuckets.
	MaxBuckets int
	// MaxBucketIDBytes bounds a bucket id's keys and values together.
	// Zero means DefaultMaxBucketIDBytes.
	MaxBucketIDBytes int
	// Margin is δ: how late an Envoy may apply an assignment after the
	// grant was asked for. A grant's assignment expires this long before
	// its window ends, so that even applied δ late it never outlives the
	// window. Zero means DefaultMargin.
	Margin time.Duration
	// IdleAfter abandons a bucket with no requests for that long: the
	// Envoy forgets it, and reports it anew with its next request. Zero
	// means DefaultIdleAfter.
	IdleAfter time.Duration
	// FailureTTL is the longest a failure-mode answer (the store could
	// not grant) lasts: one given when grants have failed for a time
	// lasts about that time, at least a second, and the session asks the
	// store again halfway through it. Zero means DefaultFailureTTL.
	FailureTTL time.Duration
	// AllowTTL is how long ALLOW_ALL lasts for buckets without a limit
	// (no rule, unlimited, shadow mode); each report renews it, and a
	// rule that starts limiting the bucket replaces it at the next
	// report. Zero means DefaultAllowTTL.
	AllowTTL time.Duration
	// Now is the server's clock (demand, idleness, wake-ups); windows
	// come from the store's. Nil means time.Now.
	Now func() time.Time
	// Metrics receives the RLQS metrics. Nil records nothing.
	Metrics *Metrics
	// Logger receives stream errors. Nil discards.
	Logger *slog.Logger
}

// Validate refuses options no server can run with, naming the field.
// Zero values stand for the defaults.
func (o Options) Validate() error {
	switch {
	case o.MaxStreams < 0:
		return fielderr.Errorf("rlqs", "MaxStreams", "%d: want at least 1", o.MaxStreams)
	case o.MaxBuckets < 0:
		return fielderr.Errorf("rlqs", "MaxBuckets", "%d: want at least 1", o.MaxBuckets)
	case o.MaxBucketIDBytes < 0:
		return fielderr.Errorf("rlqs", "MaxBucketIDBytes", "%d: want at least 1", o.MaxBucketIDBytes)
	case o.Margin < 0 || o.Margin > time.Minute:
		return fielderr.Errorf("rlqs", "Margin", "%v: want more than 0, at most 1m", o.Margin)
	case o.IdleAfter != 0 && o.IdleAfter < ReportPeriod:
		return fielderr.Errorf("rlqs", "IdleAfter", "%v: want at least %v (Envoy reports every 5 s)", o.IdleAfter, ReportPeriod)
	case o.FailureTTL < 0 || o.AllowTTL < 0:
		return fielderr.Errorf("rlqs", "FailureTTL", "%v, AllowTTL %v: want positive", o.FailureTTL, o.AllowTTL)
	}
	return nil
}

// Server serves RateLimitQuotaService. It is safe for concurrent use.
type Server struct {
	rlqsv3.UnimplementedRateLimitQuotaServiceServer

	plan  Planner
	store Granter
	opts  Options
	log   *slog.Logger
	m     *Metrics

	mu       sync.Mutex
	streams  int
	counters map[string]*counter // by counter key: what the sessions share
	done     chan struct{}
	stopOnce sync.Once
	// failingSince is when the store's grants began failing (Unix ns
	// of the server's clock; 0 while they succeed): a failure answer
	// lasts about as long as the failure has (failureTTL).
	failingSince atomic.Int64
}

// failureTTL is how long a failure answer given now lasts: as long as
// grants have been failing, in whole seconds, at least one and at most
// FailureTTL. One slow round trip on a starved machine then costs a
// second of the failure mode, not FailureTTL of it; an outage soon
// answers for FailureTTL at a time.
func (s *Server) failureTTL(now time.Time) time.Duration {
	s.failingSince.CompareAndSwap(0, now.UnixNano())
	d := now.Sub(time.Unix(0, s.failingSince.Load()))
	return min(d.Truncate(time.Second)+time.Second, s.opts.FailureTTL)
}

// New returns a server granting from store by plan's rules.
func New(plan Planner, store Granter, opts Options) *Server {
	if opts.MaxStreams <= 0 {
		opts.MaxStreams = DefaultMaxStreams
	}
	if opts.MaxBuckets <= 0 {
		opts.MaxBuckets = DefaultMaxBuckets
	}
	if opts.MaxBucketIDBytes <= 0 {
		opts.MaxBucketIDBytes = DefaultMaxBucketIDBytes
	}
	if opts.Margin <= 0 {
		opts.Margin = DefaultMargin
	}
	if opts.IdleAfter <= 0 {
		opts.IdleAfter = DefaultIdleAfter
	}
	if opts.FailureTTL <= 0 {
		opts.FailureTTL = DefaultFailureTTL
	}
	if opts.AllowTTL <= 0 {
		opts.AllowTTL = DefaultAllowTTL
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	s := &Server{plan: plan, store: store, opts: opts, log: opts.Logger, m: opts.Metrics,
		counters: map[string]*counter{}, done: make(chan struct{})}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	return s
}

// Register serves s on g.
func (s *Server) Register(g grpc.ServiceRegistrar) { rlqsv3.RegisterRateLimitQuotaServiceServer(g, s) }

// Stop ends every stream with UNAVAILABLE (the Envoys reopen theirs,
// elsewhere), for a graceful shutdown that would otherwise wait on
// streams that never end.
func (s *Server) Stop() { s.stopOnce.Do(func() { close(s.done) }) }

// ErrTooManyStreams refuses a stream past Options.MaxStreams.
var ErrTooManyStreams = errors.New("rlqs: too many streams")
