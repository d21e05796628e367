package service

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/ratelimitd/ratelimitd/config"
	"github.com/ratelimitd/ratelimitd/internal/limit"
	"github.com/ratelimitd/ratelimitd/internal/record"
)

// checkState is what the service knows of one check besides the check.
type checkState struct {
	cached  bool // answered from the over-limit cache
	read    bool // sent without its hits: the cache had rejected the request
	until   time.Time
	res     limit.Result
	failed  bool // the store could not decide it
	unknown bool // failed, but the store may have decided it (a timeout)
	kept    bool // failed, its usage charge kept by the store's journal
}

// ShouldRateLimit decides one request. Descriptors the rules do not limit
// are OK; the others are decided together, all or nothing: when one
// (non-shadow) counter is over its limit, no counter of the request
// consumes. Errors are ErrInvalidRequest, ErrNoRules or ErrCanceled; a store failure is
// not an error but answered by policy (each descriptor counted with its
// outcome, fail_open or fail_closed, in ratelimitd_decisions_total).
func (s *Service) ShouldRateLimit(ctx context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	start := time.Now()
	resp, err := s.decide(ctx, req)
	e := record.Event{Kind: record.Request, Duration: time.Since(start)}
	if err == nil {
		e.Code = resp.GetOverallCode().String()
	}
	s.event(e)
	return resp, err
}

func (s *Service) decide(ctx context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	if err := s.validate(req); err != nil {
		s.event(record.Event{Kind: record.Invalid})
		return nil, err
	}
	rules := s.rules.Load()
	if rules == nil {
		s.event(record.Event{Kind: record.NoRules})
		return nil, ErrNoRules
	}
	descs := req.GetDescriptors()
	sc := scratches.Get().(*scratch)
	defer sc.release()
	items := sc.itemsFor(len(descs))
	dom := rules.Domain(req.GetDomain())
	if dom == nil {
		s.event(record.Event{Kind: record.UnknownDomain, Domain: req.GetDomain()})
	}
	s.plan(req, dom, items)

	checks, states := s.buildChecks(req, items, sc)
	s.demand.Note(checks)
	if len(checks) > 0 {
		if err := s.evaluate(ctx, checks, states); err != nil {
			// The caller went away: its hits may have been recorded.
			s.countHits(req.GetDomain(), items, func(*item) string { return HitsUnknown })
			return nil, err
		}
	}
	resp := s.respond(req, descs, items, checks, states)
	if span := s.span(ctx); span.IsRecording() {
		span.SetAttributes(attribute.String("ratelimit.domain", req.GetDomain()),
			attribute.Int("ratelimit.descriptors", len(descs)), attribute.Int("ratelimit.counters", len(checks)),
			attribute.String("ratelimit.overall_code", resp.GetOverallCode().String()),
			attribute.String("ratelimit.answer_path", answerPath(states)))
	}
	if s.log.Enabled(ctx, slog.LevelDebug) {
		s.log.DebugContext(ctx, "decision", "domain", req.GetDomain(), "descriptors", len(descs),
			"checks", len(checks), "code", resp.GetOverallCode().String())
	}
	return resp, nil
}

// span is the request's span when the server traces, else a no-op one,
// found without a context lookup.
func (s *Service) span(ctx context.Context) trace.Span {
	if !s.opts.Traced {
		return noSpan
	}
	return trace.SpanFromContext(ctx)
}

var noSpan = trace.SpanFromContext(context.Background())

// ErrCanceled is the error when the caller went away (it canceled the
// call, or closed its stream) before the store decided: nobody would read
// an answer by failure policy, so none is made and none is counted.
// Otherwise a client resetting every stream it opens (HTTP/2 rapid reset)
// would raise the fail-open count, and fire its alert, at will.
var ErrCanceled = errors.New("service: the caller canceled the call")

// evaluate answers exhausted counters from the local cache and has the
// store decide the rest in one call. It returns an error only when the
// caller canceled (ErrCanceled); a store failure is marked in states.
func (s *Service) evaluate(ctx context.Context, checks []limit.Check, states []checkState) error {
	send, idx := checks, []int(nil)
	if s.cachedRefusals(checks, states) {
		if send, idx = readOnly(checks, states); len(send) == 0 {
			return nil
		}
	}
	res, err := s.storeEvaluate(ctx, send)
	if err != nil && errors.Is(ctx.Err(), context.Canceled) {
		s.event(record.Event{Kind: record.Canceled})
		return fmt.Errorf("%w: %w", ErrCanceled, context.Canceled)
	}
	if err != nil {
		s.event(record.Event{Kind: record.StoreError})
		s.logFailure(ctx, err, len(send))
		unknown, kept := mayHaveRun(err), errors.Is(err, limit.ErrChargesKept)
		for c := range states {
			if !states[c].cached {
				states[c].failed, states[c].unknown, states[c].kept = true, unknown, kept
			}
		}
		return nil
	}
	s.takeResults(checks, states, res, idx)
	return nil
}

// cachedRefusals marks the checks the local cache knows exhausted and
// reports whether there were any: the request is then refused already.
// Only a consuming, vetoing request or a budget check may be
// short-circuited: a usage charge always reaches the store, where it is
// recorded.
func (s *Service) cachedRefusals(checks []limit.Check, states []checkState) bool {
	if s.cache == nil {
		return false
	}
	now, rejected := s.now(), false
	for c := range checks {
		ch := &checks[c]
		if ch.Refund || ch.NoVeto || ch.Charge() || ch.Hits == 0 && !ch.Usage {
			continue
		}
		if until, ok := s.cache.Blocked(ch.Key, ch.Limit, now); ok {
			states[c].cached, states[c].until = true, until
			rejected = true
		}
	}
	return rejected
}

// readOnly is what a request refused already sends the store, and whose
// each is (idx): its other counters read, not consumed (refunds still
// apply, a charge is recorded when refused), the exhausted ones not at
// all.
func readOnly(checks []limit.Check, states []checkState) (send []limit.Check, idx []int) {
	send = make([]limit.Check, 0, len(checks))
	for c := range checks {
		if states[c].cached {
			continue
		}
		ch := checks[c]
		if !ch.Refund && !ch.Charge() {
			ch.Hits, ch.Usage, ch.Kind, states[c].read = 0, false, limit.ByHits, true
		}
		send = append(send, ch)
		idx = append(idx, c)
	}
	return send, idx
}

// takeResults puts the store's results in the checks' states (idx maps
// them when only some were sent) and keeps the local cache: a refund
// forgets a counter, an exhausted one is blocked until its reset.
func (s *Service) takeResults(checks []limit.Check, states []checkState, res []limit.Result, idx []int) {
	now := s.now()
	for j := range res {
		c := j
		if idx != nil {
			c = idx[j]
		}
		states[c].res = res[j]
		ch := &checks[c]
		switch {
		case ch.Refund:
			if s.cache != nil {
				s.cache.Forget(ch.Key)
			}
		case s.cache != nil && !ch.NoVeto && res[j].Remaining == 0 && res[j].ResetUS > 0:
			// Exhausted: every further hit in this window is over.
			s.cache.Block(ch.Key, ch.Limit, now.Add(time.Duration(res[j].ResetUS)*time.Microsecond), now)
		}
	}
}

// ChargeKeeper is a store that can keep usage charges it was not asked
// to decide (redisstore with its charge journal): a stream-end call
// whose deadline leaves no time for the store is then applied later
// instead of lost.
type ChargeKeeper interface {
	// KeepCharges keeps the usage charges among checks to apply, and
	// reports whether it kept any.
	KeepCharges(checks []limit.Check) bool
}

// ErrNoTime is the store error when the caller's deadline leaves less than
// the margin: there is no time to ask the store and still answer in time.
var ErrNoTime = errors.New("service: caller deadline leaves no time for the store")

// storeEvaluate bounds the store call so that it ends DeadlineMargin
// before the caller's deadline; the store applies its own timeout too,
// and the shorter wins.
func (s *Service) storeEvaluate(ctx context.Context, checks []limit.Check) ([]limit.Result, error) {
	if dl, ok := ctx.Deadline(); ok {
		end := dl.Add(-s.opts.DeadlineMargin)
		if !time.Now().Before(end) {
			if k, ok := s.store.(ChargeKeeper); ok && k.KeepCharges(checks) {
				return nil, fmt.Errorf("%w (%w)", ErrNoTime, limit.ErrChargesKept)
			}
			return nil, ErrNoTime
		}
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, end)
		defer cancel()
	}
	return s.store.Evaluate(ctx, checks)
}

// logFailure logs a store failure at most once a second, so an outage
// cannot flood the log; the decisions metric counts every one.
func (s *Service) logFailure(ctx context.Context, err error, checks int) {
	if !s.lastFailLog.Allow(time.Now(), time.Second) {
		return
	}
	s.log.WarnContext(ctx, "store could not decide; answering by failure_mode",
		"err", err, "checks", checks, "default_failure_mode", s.opts.FailureMode.String())
}

// statusSlab is one descriptor's status with its limit and duration,
// allocated together.
type statusSlab struct {
	st  rlsv3.RateLimitResponse_DescriptorStatus
	lim rlsv3.RateLimitResponse_RateLimit
	dur durationpb.Duration
}

// oneStatus is a whole response of one descriptor, the common case.
type oneStatus struct {
	resp rlsv3.RateLimitResponse
	ptr  [1]*rlsv3.RateLimitResponse_DescriptorStatus
	slab [1]statusSlab
}

// newResponse returns a response with n statuses to fill in: one
// allocation for a single descriptor, three for more (the response, the
// status pointers, the statuses with their limits and durations), instead
// of three per descriptor.
func newResponse(n int) (*rlsv3.RateLimitResponse, []*rlsv3.RateLimitResponse_DescriptorStatus, []statusSlab) {
	if n == 1 {
		o := &oneStatus{}
		o.resp.Statuses = o.ptr[:]
		return &o.resp, o.ptr[:], o.slab[:]
	}
	statuses := make([]*rlsv3.RateLimitResponse_DescriptorStatus, n)
	return &rlsv3.RateLimitResponse{Statuses: statuses}, statuses, make([]statusSlab, n)
}

// storeAdmitted reports whether the store admitted the request, so that
// every check consumed its hits: none was over (but for shadow and quota
// checks), answered by the cache or left undecided.
func storeAdmitted(checks []limit.Check, states []checkState) bool {
	for c := range states {
		if states[c].cached || states[c].failed || states[c].res.Over && !checks[c].NoVeto {
			return false
		}
	}
	return true
}

// hitsResult says what became of a check's hits: charged on its counter,
// refused, or lost to a store that could not decide.
func hitsResult(ch *limit.Check, cs *checkState, stored bool) string {
	switch {
	case cs.failed && cs.kept && ch.Charge() && ch.Hits > 0:
		return HitsKept
	case cs.failed && cs.unknown:
		return HitsUnknown
	case cs.failed:
		return HitsLost
	case cs.cached || cs.read:
		return HitsRefused
	case ch.Charge() || stored && !cs.res.Over:
		return HitsCharged
	}
	return HitsRefused
}

// mayHaveRun reports whether a store error leaves the call's outcome
// unknown: a timeout or a cancellation may come after Redis ran it; a
// refusal (no time left to send, a breaker open, a connection refused, an
// error reply) means it did not.
func mayHaveRun(err error) bool {
	if errors.Is(err, ErrNoTime) {
		return false
	}
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
		return true
	}
	var nerr net.Error
	return errors.As(err, &nerr) && nerr.Timeout()
}

// countHits counts every counted descriptor's hits under the result
// result gives it.
func (s *Service) countHits(domain string, items []item, result func(*item) string) {
	for i := range items {
		if it := &items[i]; it.kind == counted && !it.refund {
			s.event(record.Event{Kind: record.Hits, Domain: domain, Label: it.label, HitsResult: result(it), Hits: it.hits})
		}
	}
}

// failureAnswer decides an item the store could not: its rule's
// failure_mode, else the global one. A refund is never denied.
func (s *Service) failureAnswer(it *item) (over bool, outcome string) {
	mode := it.failure
	if mode == config.FailureUnset {
		mode = s.opts.FailureMode
	}
	if mode == config.FailureDeny && !it.refund {
		return true, OutcomeFailClosed
	}
	return false, OutcomeFailOpen
}

// untilReset is duration_until_reset: whole seconds for windows (as the
// incumbent reports), exact for a token bucket, whose next token is often
// due in milliseconds (0: a request is allowed now).
func untilReset(dst *durationpb.Duration, a limit.Algorithm, us int64) *durationpb.Duration {
	d := time.Duration(us) * time.Microsecond
	if a == limit.TokenBucket {
		dst.Seconds, dst.Nanos = int64(d/time.Second), int32(d%time.Second)
		return dst
	}
	return ceilSeconds(dst, d)
}

// ceilSeconds sets dst to d rounded up to whole seconds, as
// envoyproxy/ratelimit reports duration_until_reset (1 to the window
// length): a client reading only the seconds never sees 0 before the
// reset.
func ceilSeconds(dst *durationpb.Duration, d time.Duration) *durationpb.Duration {
	secs := int64((d + time.Second - 1) / time.Second)
	if secs < 1 {
		secs = 1
	}
	dst.Seconds = secs
	return dst
}

// answerPath says, for a trace, how a request was answered: none (no
// counter to decide), local_cache (every counter known exhausted),
// failure_policy (the store could not decide) or store (the store
// decided: a "redis" child span shows the round trip, and the span's
// ratelimit.lease attribute a lease's part).
func answerPath(states []checkState) string {
	if len(states) == 0 {
		return "none"
	}
	cached := 0
	for _, st := range states {
		if st.failed {
			return "failure_policy"
		}
		if st.cached {
			cached++
		}
	}
	if cached == len(states) {
		return "local_cache"
	}
	return "store"
}
