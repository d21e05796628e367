package rlqs

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"

	"github.com/ratelimitd/ratelimitd/config"
	"github.com/ratelimitd/ratelimitd/internal/plan"
)

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
	plan   plan.Bucket
	// subscribed is the counter key the bucket is counted under in
	// srv.counters ("" when none).
	subscribed string
	contrib    float64 // the rate it added to its counter's rateSum

	// Demand: requests (allowed and denied) per second, from the counts
	// reported (its rate).
	meter
	lastActive time.Time // the last report with requests
	lastReport time.Time
	firstCount uint64 // requests of the first report

	// What the Envoy holds: the last strategy sent, the grant's hits
	// and the allowed requests reported since, and when it expires.
	sent          sent
	granted, used uint64
	sentAt        time.Time // of the grant
	expires       time.Time
	// The Envoy got the grant a margin after sentAt at the latest, so
	// its tokens may last to heldTill (expires + margin); spent is what
	// the grant surely spent: the allowed requests of reports counted
	// from then, where used counts them from sentAt.
	heldTill time.Time
	spent    uint64
	wake     time.Time // push a grant for the next window then
	dry      time.Time // replace the grant then: keep expects it spent
	// foreign: the Envoy may hold a token bucket another stream (another
	// instance, before a failover or restart) assigned, so the first
	// token bucket sent is preceded by a DENY_ALL, as a replacement is:
	// Envoy would scale a token bucket sent over it by the old one's
	// fill. It is assigned at its first report on this stream, as any
	// bucket: the old grant's tokens are thrown away (the counter was
	// charged for them), but the Envoy, which may be running on
	// ALLOW_ALL or on a grant about to run dry, is re-assigned within a
	// report period of losing its stream.
	foreign bool
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

// BucketKey is a bucket id's identity: its pairs in key order (Envoy's
// ids are maps: order does not matter), each part length-prefixed.
func BucketKey(id map[string]string) string {
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
	if err := ss.takeDomain(msg.GetDomain()); err != nil {
		ss.srv.m.RLQSReject("bad_domain")
		return nil, err
	}
	// One snapshot for the whole report: the domain's keys and every
	// bucket's plan come from the same rules, whatever a reload does.
	rules := ss.srv.plan.Rules()
	var keys []string
	if dom := rules.Domain(ss.domain); dom != nil {
		keys = dom.RLQSKeys
	}
	var out []*rlqsv3.RateLimitQuotaResponse_BucketAction
	var need []*bucket
	// A report past MaxBuckets is still answered for the buckets within
	// the bound, so the Envoy's known buckets keep their grants; the new
	// ones past it are refused one by one (too_many_buckets) and get no
	// assignment: Envoy's no_assignment_behavior decides them, and it
	// reports them again. gRPC's message size bounds the report's length.
	for _, u := range msg.GetBucketQuotaUsages() {
		b := ss.bucketOf(u, now)
		if b == nil {
			continue
		}
		if err := ss.replan(b, rules, keys); err != nil {
			// No rules in force: nothing to grant from; the failure
			// mode answers, as ShouldRateLimit's callers are answered.
			if a := ss.failure(b, now, ss.srv.opts.FailureTTL); a != nil {
				out = append(out, a)
			}
			continue
		}
		if b.plan.Kind != plan.Counted {
			out = append(out, ss.assign(b, allowAll(), ss.srv.opts.AllowTTL, sentAllow))
			continue
		}
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

// takeDomain holds the stream to the domain of its first report: a later
// report may leave it out (gRPC's A77 sends it once), not name another.
func (ss *Session) takeDomain(d string) error {
	switch {
	case ss.domain == "" && d == "":
		return errors.New("rlqs: the first usage report must name the domain")
	case ss.domain == "" && len(d) > config.MaxValueBytes:
		return fmt.Errorf("rlqs: domain is %d bytes, more than the %d allowed", len(d), config.MaxValueBytes)
	case ss.domain == "":
		ss.domain = d
	case d != "" && d != ss.domain:
		return fmt.Errorf("rlqs: report for domain %q on a stream of domain %q (open a stream per domain)", config.Truncate(d, 64), config.Truncate(ss.domain, 64))
	}
	return nil
}

// bucketOf is the bucket a usage report is of, its counts taken in; nil
// for one refused (a bad id, or past MaxBuckets), counted by reason.
func (ss *Session) bucketOf(u *rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage, now time.Time) *bucket {
	s := ss.srv
	id := u.GetBucketId().GetBucket()
	if reason := s.checkID(id); reason != "" {
		s.m.RLQSReject(reason)
		return nil
	}
	key := BucketKey(id)
	if b := ss.buckets[key]; b != nil {
		b.observe(now, u.GetNumRequestsAllowed(), u.GetNumRequestsDenied(), ss.srv.opts.Margin)
		s.noteRate(b)
		return b
	}
	if len(ss.buckets) >= s.opts.MaxBuckets {
		s.m.RLQSReject("too_many_buckets")
		return nil
	}
	b := &bucket{key: key, id: &rlqsv3.BucketId{Bucket: maps.Clone(id)}, meter: newMeter(now), lastActive: now, lastReport: now,
		firstCount: u.GetNumRequestsAllowed() + u.GetNumRequestsDenied()}
	if el := u.GetTimeElapsed().AsDuration(); el > 0 {
		// Envoy reports a bucket new to it at once, with no time
		// elapsed; this one it knew before this stream.
		b.foreign = true
		if el >= time.Second {
			b.rate = float64(b.firstCount) / el.Seconds()
		}
	}
	ss.buckets[key] = b
	s.m.RLQSBucket(1)
	return b
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
// them after it was sent, as if they came evenly (used). Counting them
// all made a fresh grant look half spent and replaced it early, its
// unused tokens lost.
//
// What the grant surely spent (spent) counts them only from the latest
// it could have arrived (the margin after it was sent), and allows that
// each report was made up to a margin before it reached us: a report
// counts whole once the one before it reached us a margin after that.
// Such a report with a refused request says the grant is spent: its
// token bucket refills nothing over its TTL, so it refuses only once
// empty (or expired).
func (b *bucket) observe(now time.Time, allowed, denied uint64, margin time.Duration) {
	n := allowed + denied
	span := now.Sub(b.lastReport)
	used, spent := allowed, allowed
	if b.sentAt.After(b.lastReport) && span > 0 {
		used = uint64(math.Ceil(float64(allowed) * float64(now.Sub(b.sentAt)) / float64(span)))
	}
	arrivedBy := b.sentAt.Add(margin)
	whole := !arrivedBy.Add(margin).After(b.lastReport)
	if !whole {
		from := arrivedBy
		if b.lastReport.After(from) {
			from = b.lastReport
		}
		after := max(0, now.Add(-margin).Sub(from))
		spent = uint64(math.Floor(float64(allowed) * float64(after) / float64(span+margin)))
	}
	b.used += used
	b.spent += spent
	if whole && denied > 0 {
		b.spent = max(b.spent, b.granted)
	}
	b.lastReport = now
	if n > 0 {
		b.lastActive = now
	}
	// A new bucket's report, then the next periodic one, come closer
	// than the second a rate is measured over: they add up.
	b.add(now, n)
}

// replan matches the bucket's descriptor, the domain's rlqs keys' values
// in order up to the first key the id lacks; a changed counter starts
// the grant afresh.
func (ss *Session) replan(b *bucket, rules *config.Snapshot, keys []string) error {
	var ents []*rlcommon.RateLimitDescriptor_Entry
	for _, k := range keys {
		v, ok := b.id.GetBucket()[k]
		if !ok {
			break
		}
		ents = append(ents, &rlcommon.RateLimitDescriptor_Entry{Key: k, Value: v})
	}
	var p plan.Bucket
	if len(ents) > 0 {
		var err error
		if p, err = ss.srv.plan.PlanBucketIn(rules, ss.domain, ents); err != nil {
			return err
		}
	}
	if p == b.plan && (p.Kind != plan.Counted || b.subscribed != "") {
		return nil
	}
	s := ss.srv
	s.mu.Lock()
	s.unsubscribeLocked(b)
	if p.Kind == plan.Counted {
		c := s.counters[p.Check.Key]
		if c == nil {
			d := s.plan.Demand()
			d.Watch(p.Check.Key)
			c = &counter{rls: newMeter(s.opts.Now()), rlsHits: d.Hits(p.Check.Key)}
			s.counters[p.Check.Key] = c
		}
		c.subs++
		b.subscribed = p.Check.Key
		contributeLocked(c, b)
	}
	s.mu.Unlock()
	b.plan, b.granted, b.used, b.spent, b.wake, b.dry = p, 0, 0, 0, time.Time{}, time.Time{}
	return nil
}

// Wake pushes grants for the buckets whose window ended, or whose grant
// keep expected spent by now (those still in demand), and returns them
// (nil: none).
func (ss *Session) Wake(ctx context.Context, now time.Time) *rlqsv3.RateLimitQuotaResponse {
	var need []*bucket
	for _, b := range ss.buckets {
		window := !b.wake.IsZero() && !b.wake.After(now)
		if !window && (b.dry.IsZero() || b.dry.After(now)) {
			continue
		}
		if window {
			b.wake = time.Time{}
		}
		b.dry = time.Time{} // keep sets it again while it defers
		if b.plan.Kind == plan.Counted && now.Sub(b.lastActive) < ss.srv.opts.IdleAfter && !ss.keep(b, now) {
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
		for _, w := range [2]time.Time{b.wake, b.dry} {
			if !w.IsZero() && (next.IsZero() || w.Before(next)) {
				next = w
			}
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
