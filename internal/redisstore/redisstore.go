// Package redisstore decides rate-limit checks in Redis: an embedded,
// constant Lua script decides each request all or nothing (per hash slot
// on Cluster), with "now" read from Redis's own clock and every key
// written together with its expiry; concurrent requests share one EVALSHA
// (batching). Every call is bounded; a breaker stops waiting on a Redis
// that does not answer.
package redisstore

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ratelimitd/ratelimitd/internal/fielderr"

	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/ratelimitd/ratelimitd/internal/limit"
)

// Defaults of [Options].
const (
	DefaultTimeout          = 50 * time.Millisecond
	DefaultBreakerFailures  = 3
	DefaultBreakerOpenAfter = 250 * time.Millisecond
	DefaultProbeInterval    = 100 * time.Millisecond
	DefaultPolicyCheckEvery = time.Minute
)

// Options configures a [Store].
type Options struct {
	// URL is the Redis URL, parsed by go-redis: redis://, rediss:// or
	// unix:// for Mode single; redis://h1:26379?master_name=m&addr=h2:26379
	// for sentinel; redis://h1:7000?addr=h2:7001 for cluster.
	URL string
	// Password, when set, is Redis's password (AUTH), instead of the
	// URL's: it keeps the secret off the command line.
	Password string
	// Mode is single, sentinel or cluster. Empty means sentinel when the
	// URL has master_name, else single.
	Mode string
	// Timeout bounds each Evaluate, including waiting for a pooled
	// connection. Zero means DefaultTimeout; a shorter deadline on the
	// caller's context always wins.
	Timeout time.Duration
	// ClientCert, when set, returns the client certificate to present to
	// Redis (tls-auth-clients), and RootCAs the CAs that sign Redis's
	// certificate; both are asked at every new connection, so that files
	// rotated on disk take effect without a restart. They need a
	// rediss:// URL. Nil RootCAs means the system's roots.
	ClientCert func() *tls.Certificate
	RootCAs    func() *x509.CertPool
	// BreakerFailures is the least number of failed round trips (script
	// calls that timed out or lost their connection) that opens the
	// breaker, with BreakerOpenAfter. Zero means DefaultBreakerFailures.
	BreakerFailures int
	// BreakerOpenAfter is how long round trips must keep failing, with no
	// round trip answered in between, before the breaker opens: one stall
	// or one slow batch shorter than it never opens it. Zero means
	// DefaultBreakerOpenAfter.
	BreakerOpenAfter time.Duration
	// ProbeInterval bounds each probe of an open breaker, which keeps one
	// in flight. Zero means DefaultProbeInterval.
	ProbeInterval time.Duration
	// PolicyCheckEvery is how often maxmemory-policy is read. Zero means
	// DefaultPolicyCheckEvery.
	PolicyCheckEvery time.Duration
	// CarryIncumbent starts a fixed-window counter from
	// envoyproxy/ratelimit's count (limit.Check.Incumbent) the first time
	// this store writes it in a window (see carry.go). Not on Cluster,
	// where the incumbent's keys live in other slots.
	CarryIncumbent bool
	// Metrics receives call latencies, error classes, breaker state and
	// the maxmemory policy. Nil records nothing.
	Metrics *Metrics
	// Dispatchers is the number of batching dispatchers, each with its
	// own connection (per node on Cluster). Zero means 1, measured best
	// in docs/BENCHMARKS.md (one connection carries larger batches);
	// negative turns batching off: one round trip per request (per slot
	// on Cluster).
	Dispatchers int
	// Logger receives breaker and maxmemory-policy lines. Nil discards.
	Logger *slog.Logger
	// Tracer, when set, records the Redis round trip a traced request
	// rode as a child span ("redis", with the batch's size). Nil traces
	// nothing.
	Tracer trace.Tracer
	// ChargeJournal keeps every usage charge until a replica has
	// acknowledged it, and re-applies the unacknowledged ones when the
	// master changes (see journal.go; on Cluster, per master).
	ChargeJournal bool
	// ChargeJournalAuto turns the journal on: it runs on every topology.
	ChargeJournalAuto bool
	// GrantsOnly says the store only takes and settles grants (a global
	// limits' home, whose settles count once by their own marks): no
	// journal, and no line about one.
	GrantsOnly bool
	// JournalBytes bounds the journal's memory; zero means
	// DefaultJournalBytes. Past it the oldest charges are forgotten,
	// counted.
	JournalBytes int
	// ScriptTime, when set, is sent to the script as "now" instead of
	// letting it read Redis TIME. Tests only: it lets them script a
	// timeline. Production leaves it nil.
	ScriptTime func() time.Time
}

// Validate refuses options no store can run with, naming the field. Zero
// values stand for the defaults.
func (o Options) Validate() error {
	switch {
	case o.Mode != "" && o.Mode != ModeSingle && o.Mode != ModeSentinel && o.Mode != ModeCluster:
		return fielderr.Errorf("redisstore", "Mode", "%q: want single, sentinel or cluster", o.Mode)
	case o.Timeout < 0:
		return fielderr.Errorf("redisstore", "Timeout", "%v: want positive", o.Timeout)
	case o.BreakerOpenAfter < 0:
		return fielderr.Errorf("redisstore", "BreakerOpenAfter", "%v: want positive", o.BreakerOpenAfter)
	case o.JournalBytes < 0:
		return fielderr.Errorf("redisstore", "JournalBytes", "%d: want positive", o.JournalBytes)
	case (o.ClientCert != nil || o.RootCAs != nil) && o.URL != "" && !strings.HasPrefix(o.URL, "rediss://"):
		return fielderr.Errorf("redisstore", "URL", "%s: TLS files need a rediss:// URL", Redact(o.URL))
	case o.URL != "":
		if err := parseURL(o.URL, o.Mode); err != nil {
			return fielderr.Errorf("redisstore", "URL", "%q: %s", Redact(o.URL), urlProblem(o.URL, err))
		}
	}
	return nil
}

// Store is a Redis-backed store. It is safe for concurrent use.
type Store struct {
	client  redis.UniversalClient
	cluster *redis.ClusterClient // nil unless Mode is cluster
	mode    string
	script  *redis.Script
	// grantScript takes and gives back lease hits (scripts/grant.lua).
	grantScript *redis.Script
	// seedScript starts counters from the incumbent's counts
	// (scripts/seed.lua) when carry is set; seeded remembers which.
	seedScript *redis.Script
	carry      bool
	seeded     seeded
	timeout    time.Duration
	now        func() time.Time
	m          *Metrics
	log        *slog.Logger
	breaker    *breaker
	tracer     trace.Tracer // nil: no spans

	// Batching: dispatchers per batcher (negative: off); single is the
	// one batcher of single and sentinel modes, nodes those of Cluster's
	// masters, made as calls reach them.
	dispatchers int
	single      *batcher
	nodes       registry
	nodeIdle    time.Duration
	reloads     atomic.Int64
	done        chan struct{}
	wg          sync.WaitGroup
	closeMu     sync.Once
	policies    sync.Map // node → last maxmemory-policy logged
	journal     *journal // nil when off
	journalStop chan struct{}
	journalWG   sync.WaitGroup
}

// New parses the URL and builds the client. It does not wait for Redis: a
// Redis that is down at startup is not an error, a URL that does not parse
// is. The store reads maxmemory-policy in the background until Close.
func New(opts Options) (*Store, error) {
	timeout := opts.Timeout
	if timeout <= 0 {
		timeout = DefaultTimeout
	}
	client, cluster, mode, err := newClient(opts, timeout)
	if err != nil {
		return nil, err
	}
	scripts, err := loadScripts(decideParts, []string{"grant.lua"}, []string{"seed.lua"})
	if err != nil {
		return nil, err
	}
	if opts.CarryIncumbent && mode == ModeCluster {
		return nil, errors.New("redisstore: carrying envoyproxy/ratelimit's counts needs a single or Sentinel Redis: on Cluster its keys live in other slots than ratelimitd's")
	}
	s := &Store{
		client: client, cluster: cluster, mode: mode,
		script: scripts[0], grantScript: scripts[1], seedScript: scripts[2], timeout: timeout, carry: opts.CarryIncumbent,
		now: opts.ScriptTime, m: opts.Metrics, log: opts.Logger, tracer: opts.Tracer, done: make(chan struct{}), nodeIdle: nodeIdle,
	}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	s.breaker = s.newStoreBreaker(opts)
	if s.dispatchers = opts.Dispatchers; s.dispatchers >= 0 {
		if s.dispatchers == 0 {
			s.dispatchers = 1
		}
		if s.cluster == nil {
			s.single = s.newBatcher(s.client, nil)
		}
	}
	s.startJournal(opts)
	every := opts.PolicyCheckEvery
	if every <= 0 {
		every = DefaultPolicyCheckEvery
	}
	s.wg.Go(func() { s.watchPolicy(every) })
	return s, nil
}

// newStoreBreaker is the store's breaker, opts' thresholds or the
// defaults, which logs and counts each change of state.
func (s *Store) newStoreBreaker(opts Options) *breaker {
	failures, openAfter, interval := opts.BreakerFailures, opts.BreakerOpenAfter, opts.ProbeInterval
	if failures <= 0 {
		failures = DefaultBreakerFailures
	}
	if openAfter <= 0 {
		openAfter = DefaultBreakerOpenAfter
	}
	if interval <= 0 {
		interval = DefaultProbeInterval
	}
	return newBreaker(failures, openAfter, interval, s.probe, func(open bool) {
		s.m.SetBreaker(open)
		if open {
			s.log.Error("redis breaker open: answering by failure policy without waiting on Redis (a probe stays in flight; one call a second is let through)",
				"failing_for_at_least", openAfter, "probe_every", interval)
		} else {
			s.log.Info("redis breaker closed: Redis answers again")
		}
	})
}

// minBudget is the least time a call must have had for its timeout to
// count against Redis.
const minBudget = time.Millisecond

// Mode returns the deployment mode in use: single, sentinel or cluster.
func (s *Store) Mode() string { return s.mode }

// Ping checks that Redis answers and loads the script, so the first
// request does not pay for it.
func (s *Store) Ping(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, max(s.timeout*4, time.Second))
	defer cancel()
	if err := s.probe(ctx); err != nil {
		return fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	return nil
}

// SayWhenAnswering logs, once Redis answers a ping (tried every half
// second until the store closes), that it answers: a start that found it
// not answering said so, and the operator must not be left to guess.
func (s *Store) SayWhenAnswering(since time.Time) {
	const every = 500 * time.Millisecond
	s.wg.Go(func() {
		s.repeat(every, every, func() bool {
			ctx, cancel := context.WithTimeout(context.Background(), max(s.timeout, 100*time.Millisecond))
			defer cancel()
			if s.probe(ctx) != nil {
				return false
			}
			s.log.Info("redis answers now", "mode", s.mode, "after", time.Since(since).Round(time.Millisecond))
			return true
		})
	})
}

// Warm readies n connections for grants (the grant script loaded on
// one, then a PING at once on each other, the handshake with each), so that
// up to n grant calls made together later find a connection and the
// script ready: to a Redis far away, a call that must dial and handshake
// first, or load the script, takes two or three round trips instead of
// one. On Cluster, on every master.
func (s *Store) Warm(ctx context.Context, n int) error {
	ready := func(c redis.UniversalClient) error {
		// One first: a Redis that does not answer is not dialled n
		// times more.
		if err := s.grantScript.Load(ctx, c).Err(); err != nil {
			return err
		}
		errs := make([]error, n)
		var wg sync.WaitGroup
		for i := 1; i < n; i++ {
			wg.Go(func() { errs[i] = c.Ping(ctx).Err() })
		}
		wg.Wait()
		return errors.Join(errs...)
	}
	if s.cluster != nil {
		return s.cluster.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error { return ready(c) })
	}
	return ready(s.client)
}

// probe pings and loads the script (on every master on Cluster).
func (s *Store) probe(ctx context.Context) error {
	if s.cluster != nil {
		return s.cluster.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error {
			return s.script.Load(ctx, c).Err()
		})
	}
	if err := s.client.Ping(ctx).Err(); err != nil {
		return fmt.Errorf("ping: %w", err)
	}
	if err := s.script.Load(ctx, s.client).Err(); err != nil {
		return fmt.Errorf("script load: %w", err)
	}
	return nil
}

// Evaluate decides checks: in one script call (shared with concurrent
// requests when batching), or on Cluster one call per hash slot, in slot
// order (see evaluateGroups), so a rejected request consumes no limit.
// Errors wrap ErrUnavailable.
func (s *Store) Evaluate(ctx context.Context, checks []limit.Check) ([]limit.Result, error) {
	if len(checks) == 0 {
		return nil, nil
	}
	if s.carry {
		s.seed(ctx, checks)
	}
	return s.evaluateExact(ctx, checks)
}

// evaluateExact decides checks in Redis, leases aside. With a journal,
// the usage charges among them are settled in it whatever comes of the
// call: kept until a replica has them when Redis recorded them, kept to
// apply when it did not (see journal.go), and the error then says so
// (limit.ErrChargesKept).
func (s *Store) evaluateExact(ctx context.Context, checks []limit.Check) ([]limit.Result, error) {
	keep := s.journal != nil && hasJournaled(checks)
	if keep {
		// Marked, a charge counts once however often the journal sends
		// it: again when unanswered, re-applied after a failover, and a
		// kept one applied by a call that went unanswered too.
		checks = s.journal.marks.marked(checks, time.Now())
	}
	res, err := s.decideExact(ctx, checks, keep)
	if err != nil && keep {
		err = fmt.Errorf("%w (%w)", err, limit.ErrChargesKept)
	}
	return res, err
}

// decideExact decides checks; keep: settle their charges in the journal.
func (s *Store) decideExact(ctx context.Context, checks []limit.Check, keep bool) ([]limit.Result, error) {
	ok, trial := s.breaker.allow()
	if !ok {
		s.m.RedisCall(0, ClassBreakerOpen)
		err := fmt.Errorf("%w: %w", ErrUnavailable, ErrBreakerOpen)
		if keep {
			s.journal.settle(checks, nil, err)
		}
		return nil, err
	}
	if trial {
		defer s.breaker.trialDone()
	}
	deadline := time.Now().Add(s.timeout)
	if dl, ok := ctx.Deadline(); ok && dl.Before(deadline) {
		deadline = dl
	}
	if s.dispatchers < 0 {
		// Batched calls carry the deadline instead: a context with a
		// timer per request was 4 % of the service's CPU.
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, deadline)
		defer cancel()
	}
	if s.cluster != nil {
		if groups := groupBySlot(len(checks), func(i int) string { return checks[i].Key }); len(groups) > 1 {
			return s.evaluateGroups(ctx, deadline, checks, groups, keep)
		}
	}
	return s.eval(ctx, deadline, checks, keep)
}

// eval runs the script once over checks, which share one slot, by the
// deadline.
func (s *Store) eval(ctx context.Context, deadline time.Time, checks []limit.Check, keep bool) ([]limit.Result, error) {
	start := time.Now()
	budget := deadline.Sub(start)
	// A child span only under a recording one: untraced requests pay
	// nothing for it.
	var span trace.Span
	if s.tracer != nil && trace.SpanFromContext(ctx).IsRecording() {
		ctx, span = s.tracer.Start(ctx, "redis", trace.WithSpanKind(trace.SpanKindClient))
	}

	var vals []any
	var err error
	batch := 1
	if s.dispatchers >= 0 {
		// The dispatcher settles a kept call's charges.
		vals, batch, err = s.submit(ctx, deadline, checks, keep)
	} else {
		vals, err = s.run(ctx, [][]limit.Check{checks})
		s.breaker.roundTrip(start, deadline, err)
		if err == nil {
			vals, err = splitReply(vals, 0, len(checks))
		}
		if keep {
			s.journal.settle(checks, results(vals, len(checks)), err)
		}
	}
	if span != nil {
		span.SetAttributes(attribute.String("db.system.name", "redis"), attribute.String("db.operation.name", "EVALSHA"),
			attribute.String("ratelimit.redis.script", "decide.lua"), attribute.Int("ratelimit.redis.keys", len(checks)),
			attribute.Int("ratelimit.redis.batch_size", batch))
		if err != nil {
			span.SetStatus(codes.Error, err.Error())
		}
		span.End()
	}
	class := Classify(err)
	if class == ClassTimeout && (errors.Is(err, context.Canceled) || budget < minBudget) {
		// The caller gave up, or came with almost no time left: that says
		// nothing about Redis, and must not open the breaker.
		class = ClassCanceled
	}
	// The breaker has heard of this call's round trip, if it made one:
	// a call that timed out waiting in the queue behind a stall says
	// nothing more about Redis.
	s.m.RedisCall(time.Since(start), class)
	if err != nil {
		return nil, fmt.Errorf("redisstore: eval decide (%d keys, %s): %w: %w", len(checks), class, ErrUnavailable, err)
	}
	return results(vals, len(checks)), nil
}

// results reads n checks' results from the script's reply (nil: none).
func results(vals []any, n int) []limit.Result {
	if vals == nil {
		return nil
	}
	out := make([]limit.Result, n)
	for i := range out {
		over, _ := vals[3*i].(int64)
		remaining, _ := vals[3*i+1].(int64)
		reset, _ := vals[3*i+2].(int64)
		out[i] = limit.Result{Over: over == 1, Remaining: uint64(remaining), ResetUS: reset}
	}
	return out
}

// ScriptReloads returns how many times the script had to be sent again
// because Redis had lost it (NOSCRIPT: a restart, SCRIPT FLUSH, failover).
func (s *Store) ScriptReloads() int64 { return s.reloads.Load() }

// BreakerOpen reports whether the breaker is open.
func (s *Store) BreakerOpen() bool { return s.breaker.isOpen() }

// Close stops the background probe and policy watch, then closes the
// client's connections.
func (s *Store) Close() error {
	var err error
	s.closeMu.Do(func() {
		if s.journal != nil {
			close(s.journalStop)
			s.journalWG.Wait()
			s.journal.close()
		}
		s.nodes.close()
		close(s.done)
		s.breaker.stop()
		s.wg.Wait()
		err = s.client.Close()
	})
	return err
}
