// Package rlqstest simulates the RLQS client of Envoy's
// envoy.filters.http.rate_limit_quota filter, for tests: no Envoy binary
// can be installed where ratelimitd is tested. It behaves as the filter's
// source (source/extensions/filters/http/rate_limit_quota/) does, not as
// the proto comments say:
//
//   - one stream per server and domain, opened by the first bucket;
//   - a report right away for each new bucket (its first request
//     included, time_elapsed 0), then every bucket every 5 s whatever
//     reporting_interval says, time_elapsed in whole seconds;
//   - reports are built (and their counts reset) even while the stream
//     is down, and then dropped, not resent; the stream is reopened at
//     the next report;
//   - only blanket_rule and token_bucket assignments take effect;
//     requests_per_time_unit, an unset strategy, an empty or unknown
//     bucket id are ignored;
//   - TTLs count whole seconds, an unset TTL expires at once;
//   - a token bucket re-sent with the same settings keeps its tokens,
//     with other settings it starts at new_max × remaining / old_max
//     (full when the bucket held none); refill counts whole seconds of
//     fill_interval;
//   - before any assignment, no_assignment_behavior decides (default
//     ALLOW_ALL); when one expires, expired_assignment_behavior's
//     fallback for its timeout, else no_assignment_behavior again;
//   - an abandon action erases the bucket; its next request makes it
//     new.
//
// Time is the caller's: [Envoy.Tick] and [Envoy.Request] take "now", so
// a test drives a fleet on a fake clock, or on time.Now.
package rlqstest

import (
	"maps"
	"math"
	"slices"
	"sync"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/ratelimitd/ratelimitd/internal/rlqs"
)

// ReportInterval is how often Envoy reports every bucket: its filter
// ignores the configured reporting_interval today.
const ReportInterval = 5 * time.Second

// Settings is a filter's configuration.
type Settings struct {
	// Domain names the stream's rules.
	Domain string
	// NoAssignment is no_assignment_behavior's blanket rule (ALLOW_ALL,
	// Envoy's default, when unset).
	NoAssignment typev3.RateLimitStrategy_BlanketRule
	// Expired is expired_assignment_behavior's fallback strategy, applied
	// for ExpiredFor when an assignment expires; nil reverts to
	// NoAssignment at once.
	Expired    *typev3.RateLimitStrategy
	ExpiredFor time.Duration
}

// Strict is the configuration under which a fleet never admits more than
// a rule's limit: DENY_ALL before any assignment and once one expires.
func Strict(domain string) Settings {
	return Settings{
		Domain:       domain,
		NoAssignment: typev3.RateLimitStrategy_DENY_ALL,
		Expired:      &typev3.RateLimitStrategy{Strategy: &typev3.RateLimitStrategy_BlanketRule_{BlanketRule: typev3.RateLimitStrategy_DENY_ALL}},
		ExpiredFor:   time.Hour,
	}
}

// Envoy is one simulated Envoy's RLQS client, for one domain. It is safe
// for concurrent use; what the transport delivers is applied at the next
// Tick or Request, in order.
type Envoy struct {
	set  Settings
	dial Dialer

	mu         sync.Mutex
	now        time.Time
	conn       Conn
	gen        int // of conn: a closed note of an older stream is ignored
	started    bool
	nextReport time.Time
	buckets    map[string]*bucket
	stats      Stats

	inMu  sync.Mutex
	inbox []event
}

// Stats are an Envoy's counts since it started.
type Stats struct {
	Allowed, Denied uint64
	// Reports and Dropped count report messages sent and dropped (no
	// stream); Dials the streams opened; Responses the responses applied.
	Reports, Dropped, Dials, Responses int
	// What assignments did to tokens a bucket held. Revoked: tokens a
	// blanket rule dropped, not replaced by a token bucket in the same
	// response. Replaced: tokens dropped by a blanket rule the same
	// response follows with a token bucket (the server replacing a
	// grant). ScaledAway: the part of a token bucket's max_tokens the
	// bucket did not get, applied over another token bucket.
	// Parts of a token count for nothing: they admit nothing.
	Revoked, Replaced, ScaledAway float64
}

type event struct {
	resp   *rlqsv3.RateLimitQuotaResponse
	closed bool
	gen    int
}

type bucket struct {
	id              map[string]string
	allowed, denied uint64 // since the last report
	lastReport      time.Time

	// action is the assignment in force, nil for no_assignment_behavior;
	// expires ends it. fallback marks expired_assignment_behavior's.
	action   *typev3.RateLimitStrategy
	expires  time.Time
	fallback bool
	tb       *tokenBucket
}

// tokenBucket is Envoy's token bucket: it starts full and refills
// continuously at tokens_per_fill per whole seconds of fill_interval.
type tokenBucket struct {
	max, tokens, rate float64
	at                time.Time
}

func (t *tokenBucket) refill(now time.Time) {
	if now.After(t.at) {
		t.tokens = min(t.max, t.tokens+now.Sub(t.at).Seconds()*t.rate)
		t.at = now
	}
}

func (t *tokenBucket) take(now time.Time) bool {
	t.refill(now)
	if t.tokens < 1 {
		return false
	}
	t.tokens--
	return true
}

// New returns an Envoy that opens its streams with dial. Nothing is sent
// before its first request.
func New(set Settings, dial Dialer) *Envoy {
	return &Envoy{set: set, dial: dial, buckets: map[string]*bucket{}}
}

// BucketKey is a bucket id's identity, as the server keys it.
func BucketKey(id map[string]string) string { return rlqs.BucketKey(id) }

// Request decides one request of bucket id at now, as the filter does,
// and reports whether it was allowed.
func (e *Envoy) Request(now time.Time, id map[string]string) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.advance(now)
	key := BucketKey(id)
	b := e.buckets[key]
	if b == nil {
		ok := e.set.NoAssignment == typev3.RateLimitStrategy_ALLOW_ALL
		b = &bucket{id: maps.Clone(id), lastReport: now}
		e.count(b, ok)
		e.buckets[key] = b
		if !e.started {
			// The first bucket starts the report timer and the stream.
			e.started, e.nextReport = true, now.Add(ReportInterval)
			e.open()
		}
		e.send(e.report(now, []*bucket{b}))
		return ok
	}
	ok := e.decide(b, now)
	e.count(b, ok)
	return ok
}

func (e *Envoy) count(b *bucket, ok bool) {
	if ok {
		b.allowed++
		e.stats.Allowed++
	} else {
		b.denied++
		e.stats.Denied++
	}
}

func (e *Envoy) decide(b *bucket, now time.Time) bool {
	switch {
	case b.action == nil:
		return e.set.NoAssignment == typev3.RateLimitStrategy_ALLOW_ALL
	case b.action.GetTokenBucket() != nil:
		return b.tb.take(now)
	default:
		return b.action.GetBlanketRule() == typev3.RateLimitStrategy_ALLOW_ALL
	}
}

// Tick runs what is due by now: delivered responses and stream ends,
// assignment expiries and reports, in time order.
func (e *Envoy) Tick(now time.Time) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.advance(now)
}

// advance runs the timers due by now in time order, then applies what
// was delivered, at now.
func (e *Envoy) advance(now time.Time) {
	if now.Before(e.now) {
		now = e.now
	}
	e.timers(now)
	if e.drain() {
		e.timers(now) // an assignment with no TTL expires at once
	}
}

func (e *Envoy) timers(now time.Time) {
	for {
		next, which := now, ""
		if e.started && !e.nextReport.After(next) {
			next, which = e.nextReport, "report"
		}
		var due *bucket
		for _, b := range e.buckets {
			if b.action != nil && !b.expires.After(next) && (due == nil || b.expires.Before(next)) {
				next, which, due = b.expires, "expire", b
			}
		}
		if which == "" {
			break
		}
		e.now = next
		if which == "report" {
			e.nextReport = next.Add(ReportInterval)
			e.periodic(next)
		} else {
			e.expire(due, next)
		}
	}
	e.now = now
}

func (e *Envoy) expire(b *bucket, now time.Time) {
	if b.fallback || e.set.Expired == nil {
		b.action, b.tb, b.fallback = nil, nil, false
		return
	}
	e.apply(b, e.set.Expired, now, e.set.ExpiredFor)
	b.fallback = true
}

// periodic reports every bucket (none, once all were abandoned); while
// the stream is down it tries to open one, and drops the report when it
// cannot.
func (e *Envoy) periodic(now time.Time) {
	all := make([]*bucket, 0, len(e.buckets))
	for _, k := range slices.Sorted(maps.Keys(e.buckets)) {
		all = append(all, e.buckets[k])
	}
	r := e.report(now, all)
	if e.conn == nil {
		e.open()
	}
	e.send(r)
}

func (e *Envoy) report(now time.Time, bs []*bucket) *rlqsv3.RateLimitQuotaUsageReports {
	r := &rlqsv3.RateLimitQuotaUsageReports{Domain: e.set.Domain}
	for _, b := range bs {
		r.BucketQuotaUsages = append(r.BucketQuotaUsages, &rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{
			BucketId:           &rlqsv3.BucketId{Bucket: maps.Clone(b.id)},
			TimeElapsed:        &durationpb.Duration{Seconds: int64(now.Sub(b.lastReport) / time.Second)},
			NumRequestsAllowed: b.allowed,
			NumRequestsDenied:  b.denied,
		})
		b.allowed, b.denied, b.lastReport = 0, 0, now
	}
	return r
}

func (e *Envoy) open() {
	e.gen++
	gen := e.gen
	c, err := e.dial(func(r *rlqsv3.RateLimitQuotaResponse) { e.post(event{resp: r, gen: gen}) },
		func(error) { e.post(event{closed: true, gen: gen}) })
	if err == nil {
		e.conn = c
		e.stats.Dials++
	}
}

func (e *Envoy) send(r *rlqsv3.RateLimitQuotaUsageReports) {
	if e.conn == nil || e.conn.Send(r) != nil {
		e.stats.Dropped++
		return
	}
	e.stats.Reports++
}

func (e *Envoy) post(ev event) {
	e.inMu.Lock()
	e.inbox = append(e.inbox, ev)
	e.inMu.Unlock()
}

// drain applies the delivered responses and stream ends, in order, and
// reports whether there were any.
func (e *Envoy) drain() bool {
	e.inMu.Lock()
	evs := e.inbox
	e.inbox = nil
	e.inMu.Unlock()
	for _, ev := range evs {
		if ev.gen != e.gen {
			continue
		}
		if ev.closed {
			if e.conn != nil {
				e.conn.Close()
			}
			e.conn = nil
			continue
		}
		e.stats.Responses++
		e.respond(ev.resp)
	}
	return len(evs) > 0
}

// respond applies one response's actions in order, as the filter does.
func (e *Envoy) respond(resp *rlqsv3.RateLimitQuotaResponse) {
	dropped := map[string]float64{} // by a blanket rule, for the stats
	defer func() {
		for _, n := range dropped {
			e.stats.Revoked += n
		}
	}()
	for _, a := range resp.GetBucketAction() {
		id := a.GetBucketId().GetBucket()
		if len(id) == 0 {
			continue
		}
		key := BucketKey(id)
		b := e.buckets[key]
		if b == nil {
			continue
		}
		if a.GetAbandonAction() != nil {
			delete(e.buckets, key)
			continue
		}
		s := a.GetQuotaAssignmentAction().GetRateLimitStrategy()
		switch s.GetStrategy().(type) {
		case *typev3.RateLimitStrategy_BlanketRule_, *typev3.RateLimitStrategy_TokenBucket:
		default:
			continue // requests_per_time_unit, or no strategy: ignored
		}
		ttl := time.Duration(a.GetQuotaAssignmentAction().GetAssignmentTimeToLive().GetSeconds()) * time.Second
		if s.GetTokenBucket() != nil {
			e.stats.Replaced += dropped[key]
			delete(dropped, key)
		} else if b.tb != nil && b.action.GetTokenBucket() != nil {
			b.tb.refill(e.now)
			dropped[key] += math.Floor(b.tb.tokens) // a part of a token admits nothing
		}
		e.apply(b, s, e.now, ttl)
		b.fallback = false
	}
}

// apply puts s in force on b from now for ttl.
func (e *Envoy) apply(b *bucket, s *typev3.RateLimitStrategy, now time.Time, ttl time.Duration) {
	if tb := s.GetTokenBucket(); tb != nil {
		old := b.action.GetTokenBucket()
		if old == nil || !proto.Equal(old, tb) {
			// Other settings: a new bucket, holding the old one's share.
			fill := time.Duration(tb.GetFillInterval().GetSeconds()) * time.Second
			nb := &tokenBucket{max: float64(tb.GetMaxTokens()), tokens: float64(tb.GetMaxTokens()), at: now}
			if fill > 0 {
				nb.rate = float64(tb.GetTokensPerFill().GetValue()) / fill.Seconds()
			}
			if old != nil && b.tb != nil && b.tb.max > 0 {
				b.tb.refill(now)
				nb.tokens = nb.max * b.tb.tokens / b.tb.max
				e.stats.ScaledAway += nb.max - math.Floor(nb.tokens)
			}
			b.tb = nb
		}
	} else {
		b.tb = nil
	}
	b.action = proto.Clone(s).(*typev3.RateLimitStrategy)
	b.expires = now.Add(ttl)
}

// Stats returns the counts so far.
func (e *Envoy) Stats() Stats {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.stats
}

// Buckets returns how many buckets the Envoy holds.
func (e *Envoy) Buckets() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return len(e.buckets)
}

// Tokens returns the tokens of bucket id's token bucket at the last
// Tick, -1 without one.
func (e *Envoy) Tokens(id map[string]string) float64 {
	e.mu.Lock()
	defer e.mu.Unlock()
	b := e.buckets[BucketKey(id)]
	if b == nil || b.tb == nil {
		return -1
	}
	return b.tb.tokens
}

// Strategy names what decides bucket id now: "none" (no bucket), "default"
// (no_assignment_behavior), "token_bucket", "allow_all" or "deny_all".
func (e *Envoy) Strategy(id map[string]string) string {
	e.mu.Lock()
	defer e.mu.Unlock()
	b := e.buckets[BucketKey(id)]
	switch {
	case b == nil:
		return "none"
	case b.action == nil:
		return "default"
	case b.action.GetTokenBucket() != nil:
		return "token_bucket"
	case b.action.GetBlanketRule() == typev3.RateLimitStrategy_DENY_ALL:
		return "deny_all"
	}
	return "allow_all"
}

// Close ends the stream.
func (e *Envoy) Close() {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.conn != nil {
		e.conn.Close()
		e.conn = nil
	}
	e.gen++
}
