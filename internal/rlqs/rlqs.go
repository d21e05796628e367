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
	"fmt"
	"io"
	"log/slog"
	"maps"
	"math"
	"slices"
	"strings"
	"sync"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/ratelimitd/ratelimitd/config"
	"github.com/ratelimitd/ratelimitd/internal/limit"
	"github.com/ratelimitd/ratelimitd/internal/metrics"
	"github.com/ratelimitd/ratelimitd/internal/service"
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
	PlanBucket(domain string, ents []*rlcommon.RateLimitDescriptor_Entry) (service.BucketPlan, error)
	// Demand counts ShouldRateLimit's hits on the counters buckets
	// draw on, for the RLS callers' share.
	Demand() *service.Demand
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
	// FailureTTL is how long a failure-mode answer (the store could not
	// grant) lasts; Envoy's next report asks again. Zero means
	// DefaultFailureTTL.
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
	Metrics *metrics.Metrics
	// Logger receives stream errors. Nil discards.
	Logger *slog.Logger
}

// Server serves RateLimitQuotaService. It is safe for concurrent use.
type Server struct {
	rlqsv3.UnimplementedRateLimitQuotaServiceServer

	plan  Planner
	store Granter
	opts  Options
	log   *slog.Logger
	m     *metrics.Metrics

	mu       sync.Mutex
	streams  int
	counters map[string]*counter // by counter key: what the sessions share
	done     chan struct{}
	stopOnce sync.Once
}

// counter is what the server knows of one counter its buckets draw on.
type counter struct {
	subs      int       // buckets of all streams on it
	rateSum   float64   // their measured demand, requests per second
	remaining uint64    // after the last grant
	validTill time.Time // remaining is of a window that ends then
	// The demand of ShouldRateLimit's callers on it here, hits per
	// second (rlsRate < 0 until measured), from Demand's count.
	rlsRate  float64
	rlsHits  uint64
	rlsSince time.Time
}

// measureRLSLocked updates c's RLS demand from its count at now, as a
// bucket's demand is measured: over a second at least, averaged with the
// rate before.
func (s *Server) measureRLSLocked(key string, c *counter, now time.Time) {
	el := now.Sub(c.rlsSince)
	if el < time.Second {
		return
	}
	n := s.plan.Demand().Hits(key)
	r := float64(n-c.rlsHits) / el.Seconds()
	if c.rlsRate < 0 {
		c.rlsRate = r
	} else {
		c.rlsRate = (c.rlsRate + r) / 2
	}
	c.rlsHits, c.rlsSince = n, now
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

// StreamRateLimitQuotas serves one Envoy's stream: each usage report is
// answered with the assignments it calls for, and grants for a new
// window are pushed when it starts.
func (s *Server) StreamRateLimitQuotas(stream grpc.BidiStreamingServer[rlqsv3.RateLimitQuotaUsageReports, rlqsv3.RateLimitQuotaResponse]) error {
	ss, err := s.NewSession()
	if err != nil {
		return status.Error(codes.ResourceExhausted, err.Error())
	}
	defer ss.Close()
	ctx := stream.Context()
	msgs, errc := make(chan *rlqsv3.RateLimitQuotaUsageReports), make(chan error, 1)
	go func() {
		for {
			m, err := stream.Recv()
			if err != nil {
				errc <- err
				return
			}
			select {
			case msgs <- m:
			case <-ctx.Done():
				return
			}
		}
	}()
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		wait := time.Hour
		if w := ss.NextWake(); !w.IsZero() {
			wait = max(0, w.Sub(s.opts.Now()))
		}
		timer.Reset(wait)
		var resp *rlqsv3.RateLimitQuotaResponse
		select {
		case <-ctx.Done():
			return status.FromContextError(ctx.Err()).Err()
		case <-s.done:
			return status.Error(codes.Unavailable, "rlqs: server shutting down")
		case err := <-errc:
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		case m := <-msgs:
			if resp, err = ss.Report(ctx, s.opts.Now(), m); err != nil {
				s.log.Warn("rlqs: stream refused", "err", err)
				return status.Error(codes.InvalidArgument, err.Error())
			}
		case <-timer.C:
			resp = ss.Wake(ctx, s.opts.Now())
		}
		if resp != nil {
			if err := stream.Send(resp); err != nil {
				return err
			}
		}
	}
}

// Session is one stream's state: its domain and buckets. Its methods are
// called from one goroutine at a time.
type Session struct {
	srv     *Server
	domain  string
	buckets map[string]*bucket
	closed  bool
}

type sent uint8

const (
	sentNone sent = iota
	sentTokens
	sentAllow
	sentDeny
)

// String names the kind as ratelimitd_rlqs_assignments_total does.
func (k sent) String() string {
	switch k {
	case sentTokens:
		return "token_bucket"
	case sentAllow:
		return "allow_all"
	case sentDeny:
		return "deny_all"
	}
	return "none"
}

type bucket struct {
	key string // in Session.buckets
	// needed marks it in the grants a report is collecting.
	needed bool
	id     *rlqsv3.BucketId
	plan   service.BucketPlan
	// subscribed is the counter key the bucket is counted under in
	// srv.counters ("" when none).
	subscribed string
	contrib    float64 // the rate it added to its counter's rateSum

	// Demand: requests (allowed and denied) per second, from the
	// counts reported since rateSince; rate < 0 until measured.
	rate       float64
	pending    uint64
	rateSince  time.Time
	lastActive time.Time // the last report with requests
	lastReport time.Time
	firstCount uint64 // requests of the first report

	// What the Envoy holds: the last strategy sent, the grant's hits
	// and the allowed requests reported since, and when it expires.
	sent           sent
	granted, used  uint64
	sentAt         time.Time // of the grant
	expires        time.Time
	wake           time.Time // push a grant for the next window then
	failureAnswers bool      // the last answer was the failure mode's
	// foreign: the Envoy may hold a token bucket another stream (another
	// instance, before a failover or restart) assigned, so the first
	// token bucket sent is preceded by a DENY_ALL, as a replacement is:
	// Envoy would scale a token bucket sent over it by the old one's
	// fill. inheritTill: until then, while the Envoy refuses nothing,
	// what it holds serves it and nothing is sent, so that no tokens of
	// the old grant are thrown away; past it (it may be under ALLOW_ALL
	// rather than a grant) the bucket is granted.
	foreign     bool
	inheritTill time.Time
}

// NewSession opens a session, or refuses one past MaxStreams.
func (s *Server) NewSession() (*Session, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.streams >= s.opts.MaxStreams {
		s.m.RLQSReject("too_many_streams")
		return nil, fmt.Errorf("%w: %d open, the most Options.MaxStreams allows", ErrTooManyStreams, s.streams)
	}
	s.streams++
	s.m.RLQSStream(1)
	return &Session{srv: s, buckets: map[string]*bucket{}}, nil
}

// Close ends the session. Grants its Envoy holds are not given back: it
// may still use them until they expire.
func (ss *Session) Close() {
	if ss.closed {
		return
	}
	ss.closed = true
	s := ss.srv
	s.mu.Lock()
	s.streams--
	for _, b := range ss.buckets {
		s.unsubscribeLocked(b)
	}
	s.mu.Unlock()
	s.m.RLQSStream(-1)
	s.m.RLQSBucket(-len(ss.buckets))
}

func (s *Server) unsubscribeLocked(b *bucket) {
	if b.subscribed == "" {
		return
	}
	if c := s.counters[b.subscribed]; c != nil {
		c.rateSum -= b.contrib
		if c.subs--; c.subs <= 0 {
			delete(s.counters, b.subscribed)
			s.plan.Demand().Unwatch(b.subscribed)
		}
	}
	b.subscribed, b.contrib = "", 0
}

// bucketKey is a bucket id's identity: its pairs in key order (Envoy's
// ids are maps: order does not matter).
func bucketKey(id map[string]string) string {
	var b strings.Builder
	for _, k := range slices.Sorted(maps.Keys(id)) {
		fmt.Fprintf(&b, "%d:%s%d:%s", len(k), k, len(id[k]), id[k])
	}
	return b.String()
}

// Report takes one usage report at now and returns the assignments it
// calls for (nil: none). An error ends the stream: a report without a
// domain first, or naming another one later.
func (ss *Session) Report(ctx context.Context, now time.Time, msg *rlqsv3.RateLimitQuotaUsageReports) (*rlqsv3.RateLimitQuotaResponse, error) {
	s := ss.srv
	switch d := msg.GetDomain(); {
	case ss.domain == "" && d == "":
		s.m.RLQSReject("bad_domain")
		return nil, errors.New("rlqs: the first usage report must name the domain")
	case ss.domain == "" && len(d) > config.MaxValueBytes:
		s.m.RLQSReject("bad_domain")
		return nil, fmt.Errorf("rlqs: domain is %d bytes, more than the %d allowed", len(d), config.MaxValueBytes)
	case ss.domain == "":
		ss.domain = d
	case d != "" && d != ss.domain:
		s.m.RLQSReject("bad_domain")
		return nil, fmt.Errorf("rlqs: report for domain %q on a stream of domain %q (open a stream per domain)", config.Truncate(d, 64), config.Truncate(ss.domain, 64))
	}
	// A report past MaxBuckets is still answered for the buckets within
	// the bound, so the Envoy's known buckets keep their grants; the new
	// ones past it are refused one by one (too_many_buckets) and get no
	// assignment: Envoy's no_assignment_behavior decides them, and it
	// reports them again. gRPC's message size bounds the report's length.
	usages := msg.GetBucketQuotaUsages()
	var keys []string
	if dom := s.plan.Rules().Domain(ss.domain); dom != nil {
		keys = dom.RLQSKeys
	}
	var out []*rlqsv3.RateLimitQuotaResponse_BucketAction
	var need []*bucket
	for _, u := range usages {
		id := u.GetBucketId().GetBucket()
		if reason := s.checkID(id); reason != "" {
			s.m.RLQSReject(reason)
			continue
		}
		key := bucketKey(id)
		b := ss.buckets[key]
		if b == nil {
			if len(ss.buckets) >= s.opts.MaxBuckets {
				s.m.RLQSReject("too_many_buckets")
				continue
			}
			b = &bucket{key: key, id: &rlqsv3.BucketId{Bucket: maps.Clone(id)}, rate: -1, rateSince: now, lastActive: now, lastReport: now,
				firstCount: u.GetNumRequestsAllowed() + u.GetNumRequestsDenied()}
			if el := u.GetTimeElapsed().AsDuration(); el > 0 {
				// Envoy reports a bucket new to it at once, with no time
				// elapsed; this one it knew before this stream.
				b.foreign, b.inheritTill = true, now.Add(2*ReportPeriod)
				if el >= time.Second {
					b.rate = float64(b.firstCount) / el.Seconds()
				}
			}
			ss.buckets[key] = b
			s.m.RLQSBucket(1)
		} else {
			b.observe(now, u.GetNumRequestsAllowed(), u.GetNumRequestsDenied())
			s.noteRate(b)
		}
		if err := ss.replan(b, keys); err != nil {
			// No rules in force: nothing to grant from; the failure
			// mode answers, as ShouldRateLimit's callers are answered.
			out = append(out, ss.failure(b, now))
			continue
		}
		if b.plan.Kind != service.BucketCounted {
			out = append(out, ss.assign(b, allowAll(), s.opts.AllowTTL, sentAllow))
			continue
		}
		if now.Before(b.inheritTill) && u.GetNumRequestsDenied() == 0 {
			continue
		}
		b.inheritTill = time.Time{}
		if !ss.keep(b, now) && !b.needed { // a bucket reported twice is granted once
			b.needed = true
			need = append(need, b)
		}
	}
	out = append(out, ss.abandonIdle(now)...)
	// An idle bucket reported without requests is abandoned, not granted.
	need = slices.DeleteFunc(need, func(b *bucket) bool { return ss.buckets[b.key] != b })
	out = append(out, ss.grant(ctx, now, need)...)
	if len(out) == 0 {
		return nil, nil
	}
	return &rlqsv3.RateLimitQuotaResponse{BucketAction: out}, nil
}

// checkID returns why a bucket id is refused, "" when it is not.
func (s *Server) checkID(id map[string]string) string {
	if len(id) == 0 {
		return "bucket_id_empty"
	}
	if len(id) > MaxBucketIDEntries {
		return "bucket_id_too_large"
	}
	n := 0
	for k, v := range id {
		n += len(k) + len(v)
	}
	if n > s.opts.MaxBucketIDBytes {
		return "bucket_id_too_large"
	}
	return ""
}

// observe adds a report's counts to the bucket's demand and to what its
// grant spent. A report counts from the one before it: when the grant
// was sent in between, the requests allowed before it took effect were
// spent from the grant it replaced, so the grant is charged the part of
// them after it was sent, as if they came evenly. Counting them all
// made a fresh grant look half spent and replaced it early, its unused
// tokens lost.
func (b *bucket) observe(now time.Time, allowed, denied uint64) {
	n := allowed + denied
	if span := now.Sub(b.lastReport); b.sentAt.After(b.lastReport) && span > 0 {
		allowed = uint64(math.Ceil(float64(allowed) * float64(now.Sub(b.sentAt)) / float64(span)))
	}
	b.used += allowed
	b.lastReport = now
	if n > 0 {
		b.lastActive = now
	}
	b.pending += n
	// Reports closer than a second (a new bucket's, then the next
	// periodic one) say little of a rate: they add up until one does.
	if el := now.Sub(b.rateSince); el >= time.Second {
		r := float64(b.pending) / el.Seconds()
		if b.rate < 0 {
			b.rate = r
		} else {
			b.rate = (b.rate + r) / 2
		}
		b.pending, b.rateSince = 0, now
	}
}

// replan matches the bucket's descriptor, the domain's rlqs keys' values
// in order up to the first key the id lacks; a changed counter starts
// the grant afresh.
func (ss *Session) replan(b *bucket, keys []string) error {
	var ents []*rlcommon.RateLimitDescriptor_Entry
	for _, k := range keys {
		v, ok := b.id.GetBucket()[k]
		if !ok {
			break
		}
		ents = append(ents, &rlcommon.RateLimitDescriptor_Entry{Key: k, Value: v})
	}
	var p service.BucketPlan
	if len(ents) > 0 {
		var err error
		if p, err = ss.srv.plan.PlanBucket(ss.domain, ents); err != nil {
			return err
		}
	}
	if p == b.plan && (p.Kind != service.BucketCounted || b.subscribed != "") {
		return nil
	}
	s := ss.srv
	s.mu.Lock()
	s.unsubscribeLocked(b)
	if p.Kind == service.BucketCounted {
		c := s.counters[p.Check.Key]
		if c == nil {
			d := s.plan.Demand()
			d.Watch(p.Check.Key)
			c = &counter{rlsRate: -1, rlsHits: d.Hits(p.Check.Key), rlsSince: s.opts.Now()}
			s.counters[p.Check.Key] = c
		}
		c.subs++
		b.subscribed = p.Check.Key
		contributeLocked(c, b)
	}
	s.mu.Unlock()
	b.plan, b.granted, b.used, b.wake = p, 0, 0, time.Time{}
	return nil
}

// keep reports whether the grant the Envoy holds is to stay. A replaced
// grant's unused tokens are lost to the window (Envoy drops them with the
// bucket, and what it spent of them in flight is unknown, so they cannot
// be given back safely), and a grant kept too long runs dry before the
// next report can renew it. Which costs more depends on the counter:
//
//   - a grant that lasts to the Envoy's next report stays (give or take
//     rounding: a token, or 40 % of a period's demand when that is less);
//   - one that does not stays only while the bucket's share of what the
//     counter has left, with what it holds, is under 90 % of its demand
//     until the window ends, and it holds a second of demand at least:
//     the counter will run out this window, so every token counts and
//     what this bucket does not take the others do;
//   - otherwise it is replaced now, before it runs dry.
func (ss *Session) keep(b *bucket, now time.Time) bool {
	if b.sent != sentTokens || b.granted == 0 || !now.Before(b.expires) || b.used >= b.granted {
		return false
	}
	left := float64(b.granted - b.used)
	if b.rate < 0 {
		return true
	}
	need := b.rate * ReportPeriod.Seconds()
	if left+min(1, 0.4*need) >= need {
		return true
	}
	d := ss.demand(b, now)
	return d.avail+left < 0.9*b.rate*d.windowLeft.Seconds() && left >= b.rate
}

// holds reports whether the Envoy may still hold tokens of the bucket's
// grant: unexpired, and not all reported used.
func (b *bucket) holds(now time.Time) bool {
	return b.sent == sentTokens && now.Before(b.expires) && b.granted > b.used
}

// claim is a bucket's claim on what its counter has left.
type claim struct {
	// want is what the bucket would ask for: its demand until the report
	// after its next one, so that a grant runs out as the one replacing
	// it arrives.
	want float64
	// avail is its share of what the counter has left: its share of the
	// demand on the counter here (its buckets' and the RLS callers'), at
	// least an even share.
	avail float64
	// windowLeft is how long the counter's window has to run (0: not
	// known).
	windowLeft time.Duration
}

// demand returns the bucket's claim at now.
func (ss *Session) demand(b *bucket, now time.Time) claim {
	s := ss.srv
	c := &b.plan.Check
	var cl claim
	s.mu.Lock()
	subs, remaining, share := 1.0, c.Limit, 1.0
	if ctr := s.counters[b.subscribed]; ctr != nil {
		s.measureRLSLocked(b.subscribed, ctr, now)
		rls := max(0, ctr.rlsRate)
		subs = float64(max(1, ctr.subs))
		if rls > 0 {
			subs++ // the RLS callers, as one more claimant
		}
		share = 1 / subs
		if now.Before(ctr.validTill) {
			remaining = ctr.remaining
			cl.windowLeft = ctr.validTill.Sub(now)
		}
		if b.rate > 0 && ctr.rateSum+rls > 0 {
			share = max(share, min(1, b.rate/(ctr.rateSum+rls)))
		}
	}
	s.mu.Unlock()
	if b.rate >= 0 {
		next := max(0, b.lastReport.Add(ReportPeriod).Sub(now).Seconds())
		cl.want = b.rate * (next + ReportPeriod.Seconds())
		if b.rate*ReportPeriod.Seconds() < 2 {
			// Under two requests a period, rounding to whole tokens
			// leaves the bucket dry for most of one: a token to spare.
			cl.want++
		}
	} else {
		// Not measured yet: the bucket's even share of the rule's rate
		// over two report periods, and at least what its first report
		// asked for.
		cl.want = max(float64(b.firstCount), float64(c.Limit)*2*ReportPeriod.Seconds()/(float64(c.WindowUS)/1e6)/subs)
	}
	cl.avail = float64(remaining) * share
	return cl
}

// size is how many hits to ask for: what the bucket wants, never more
// than its share of what remains, at least one.
func (ss *Session) size(b *bucket, now time.Time) uint64 {
	d := ss.demand(b, now)
	n := uint64(min(math.Ceil(d.want), float64(limit.MaxHits)))
	return max(1, min(n, uint64(d.avail)))
}

// grant takes grants for need in one store call and returns the actions
// that hand them out.
func (ss *Session) grant(ctx context.Context, now time.Time, need []*bucket) []*rlqsv3.RateLimitQuotaResponse_BucketAction {
	if len(need) == 0 {
		return nil
	}
	s := ss.srv
	ops := make([]limit.GrantOp, len(need))
	for i, b := range need {
		b.needed = false
		ops[i].Check = b.plan.Check
		ops[i].Check.Hits = ss.size(b, now)
	}
	res, err := s.store.Grant(ctx, ops)
	var out []*rlqsv3.RateLimitQuotaResponse_BucketAction
	if err != nil {
		s.log.Warn("rlqs: the store cannot grant; answering by failure mode", "buckets", len(need), "err", err)
		for _, b := range need {
			s.m.RLQSGrant("failed", 0)
			out = append(out, ss.failure(b, now))
		}
		return out
	}
	var back []limit.GrantOp
	for i, b := range need {
		r := res[i]
		reset := time.Duration(r.ResetUS) * time.Microsecond
		windowed := b.plan.Check.Algorithm != limit.TokenBucket
		ttl := 2 * ReportPeriod
		if windowed {
			ttl = (reset - s.opts.Margin).Truncate(time.Second)
		}
		if r.WindowEndUS != 0 || !windowed {
			s.noteRemaining(b.subscribed, r.Remaining, now.Add(reset))
		}
		switch {
		case r.Hits == 0 || ttl < time.Second:
			if r.Hits == 0 {
				s.m.RLQSGrant("empty", 0)
			} else {
				// Too near the window's end to hand out: give the hits
				// back.
				s.m.RLQSGrant("returned", r.Hits)
				op := ops[i]
				op.Check.Hits, op.GiveBack, op.WindowEndUS = r.Hits, true, r.WindowEndUS
				back = append(back, op)
			}
			if b.holds(now) {
				// The Envoy still holds tokens charged to the counter: a
				// DENY_ALL would throw them away. They run out on their
				// TTL (a strict config denies after); the next window's
				// grant comes at its start.
				b.wake = now.Add(max(reset, time.Second))
				break
			}
			// Deny until the next window's grant.
			out = append(out, ss.denyUntil(b, now, reset))
		default:
			s.m.RLQSGrant("taken", r.Hits)
			if b.sent == sentTokens || b.foreign {
				// What the replaced grant had left by the Envoy's last
				// report: an upper bound of the hits it never spent.
				if b.holds(now) {
					s.m.RLQSGrantLost(b.granted - b.used)
				}
				// A token bucket replacing one would carry the old
				// one's tokens over: end it first.
				out = append(out, ss.assign(b, denyAll(), ttl, sentDeny))
			}
			out = append(out, ss.assign(b, tokens(r.Hits, ttl), ttl, sentTokens))
			b.granted, b.used, b.sentAt, b.expires = r.Hits, 0, now, now.Add(ttl)
			if windowed {
				b.wake = now.Add(reset)
			}
		}
	}
	if len(back) > 0 {
		if _, err := s.store.Grant(ctx, back); err != nil {
			s.log.Warn("rlqs: a grant taken too late in its window could not be given back", "err", err)
		}
	}
	return out
}

// noteRate puts the bucket's demand into its counter's sum.
func (s *Server) noteRate(b *bucket) {
	s.mu.Lock()
	if c := s.counters[b.subscribed]; c != nil {
		contributeLocked(c, b)
	}
	s.mu.Unlock()
}

// contributeLocked makes the bucket's measured rate its part of c's sum
// (nothing while unmeasured).
func contributeLocked(c *counter, b *bucket) {
	if b.rate >= 0 {
		c.rateSum += b.rate - b.contrib
		b.contrib = b.rate
	}
}

func (s *Server) noteRemaining(key string, remaining uint64, till time.Time) {
	s.mu.Lock()
	if c := s.counters[key]; c != nil {
		c.remaining, c.validTill = remaining, till
	}
	s.mu.Unlock()
}

// denyUntil denies the bucket until its counter has budget again (the
// next window, or the bucket's next hit) and wakes the session then, a
// second from now at the soonest: a token bucket rule's next hit may be
// due in a millisecond, and asking for it hit by hit would load Redis.
func (ss *Session) denyUntil(b *bucket, now time.Time, reset time.Duration) *rlqsv3.RateLimitQuotaResponse_BucketAction {
	// TTLs are whole seconds: the first one at or after the window's
	// end, when the wake's grant replaces it anyway.
	ttl := max(time.Second, (reset+time.Second-1)/time.Second*time.Second)
	b.wake = now.Add(max(reset, time.Second))
	return ss.assign(b, denyAll(), ttl, sentDeny)
}

// failure answers by the bucket's failure mode for FailureTTL.
func (ss *Session) failure(b *bucket, now time.Time) *rlqsv3.RateLimitQuotaResponse_BucketAction {
	b.wake = time.Time{}
	if b.plan.Failure == config.FailureDeny {
		return ss.assign(b, denyAll(), ss.srv.opts.FailureTTL, sentDeny)
	}
	return ss.assign(b, allowAll(), ss.srv.opts.FailureTTL, sentAllow)
}

// Wake pushes grants for the buckets whose window ended (those still in
// demand) and returns them (nil: none).
func (ss *Session) Wake(ctx context.Context, now time.Time) *rlqsv3.RateLimitQuotaResponse {
	var need []*bucket
	for _, b := range ss.buckets {
		if b.wake.IsZero() || b.wake.After(now) {
			continue
		}
		b.wake = time.Time{}
		if b.plan.Kind == service.BucketCounted && now.Sub(b.lastActive) < ss.srv.opts.IdleAfter && !ss.keep(b, now) {
			need = append(need, b)
		}
	}
	slices.SortFunc(need, func(x, y *bucket) int { return strings.Compare(x.key, y.key) }) // answers in a stable order
	out := ss.grant(ctx, now, need)
	if len(out) == 0 {
		return nil
	}
	return &rlqsv3.RateLimitQuotaResponse{BucketAction: out}
}

// NextWake returns when Wake has work, zero for never.
func (ss *Session) NextWake() time.Time {
	var next time.Time
	for _, b := range ss.buckets {
		if !b.wake.IsZero() && (next.IsZero() || b.wake.Before(next)) {
			next = b.wake
		}
	}
	return next
}

// abandonIdle abandons the buckets without requests for IdleAfter.
func (ss *Session) abandonIdle(now time.Time) []*rlqsv3.RateLimitQuotaResponse_BucketAction {
	s := ss.srv
	var idle []*bucket
	for _, b := range ss.buckets {
		if now.Sub(b.lastActive) >= s.opts.IdleAfter {
			idle = append(idle, b)
		}
	}
	slices.SortFunc(idle, func(x, y *bucket) int { return strings.Compare(x.key, y.key) }) // answers in a stable order
	out := make([]*rlqsv3.RateLimitQuotaResponse_BucketAction, 0, len(idle))
	for _, b := range idle {
		s.mu.Lock()
		s.unsubscribeLocked(b)
		s.mu.Unlock()
		delete(ss.buckets, b.key)
		s.m.RLQSBucket(-1)
		s.m.RLQSAssignment("abandon")
		out = append(out, &rlqsv3.RateLimitQuotaResponse_BucketAction{BucketId: b.id,
			BucketAction: &rlqsv3.RateLimitQuotaResponse_BucketAction_AbandonAction_{
				AbandonAction: &rlqsv3.RateLimitQuotaResponse_BucketAction_AbandonAction{}}})
	}
	return out
}

// assign returns the action putting strategy in force on b for ttl.
func (ss *Session) assign(b *bucket, strategy *typev3.RateLimitStrategy, ttl time.Duration, kind sent) *rlqsv3.RateLimitQuotaResponse_BucketAction {
	b.sent, b.foreign = kind, false
	if kind != sentTokens {
		b.granted, b.used = 0, 0
	}
	ss.srv.m.RLQSAssignment(kind.String())
	return &rlqsv3.RateLimitQuotaResponse_BucketAction{BucketId: b.id,
		BucketAction: &rlqsv3.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction_{
			QuotaAssignmentAction: &rlqsv3.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction{
				AssignmentTimeToLive: durationpb.New(ttl.Truncate(time.Second)),
				RateLimitStrategy:    strategy,
			}}}
}

func allowAll() *typev3.RateLimitStrategy {
	return &typev3.RateLimitStrategy{Strategy: &typev3.RateLimitStrategy_BlanketRule_{BlanketRule: typev3.RateLimitStrategy_ALLOW_ALL}}
}

func denyAll() *typev3.RateLimitStrategy {
	return &typev3.RateLimitStrategy{Strategy: &typev3.RateLimitStrategy_BlanketRule_{BlanketRule: typev3.RateLimitStrategy_DENY_ALL}}
}

// tokens is a token bucket holding exactly hits, refilling one token per
// TTL and a second: less than one over the assignment's life, which the
// bucket can never spend.
func tokens(hits uint64, ttl time.Duration) *typev3.RateLimitStrategy {
	return &typev3.RateLimitStrategy{Strategy: &typev3.RateLimitStrategy_TokenBucket{TokenBucket: &typev3.TokenBucket{
		MaxTokens:     uint32(min(hits, math.MaxUint32)),
		TokensPerFill: wrapperspb.UInt32(1),
		FillInterval:  durationpb.New(ttl.Truncate(time.Second) + time.Second),
	}}}
}
