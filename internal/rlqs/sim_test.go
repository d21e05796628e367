package rlqs_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sort"
	"strings"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/ratelimitd/ratelimitd/config"
	"github.com/ratelimitd/ratelimitd/internal/limit"
	"github.com/ratelimitd/ratelimitd/internal/redisstore"
	"github.com/ratelimitd/ratelimitd/internal/redisstore/redistest"
	"github.com/ratelimitd/ratelimitd/internal/rlqs"
	"github.com/ratelimitd/ratelimitd/internal/rlqs/rlqstest"
	"github.com/ratelimitd/ratelimitd/internal/service"
)

// sim runs a fleet of simulated Envoys against one RLQS server and a real
// redis-server on one fake clock: the Envoys, the server and the grant
// script all read it, so a minute of traffic takes milliseconds and
// nothing depends on the machine's speed. Responses reach the Envoys
// delta after the server made them (the δ of docs/ARCHITECTURE.md).
type sim struct {
	t      testing.TB
	now    time.Time
	step   time.Duration
	delta  time.Duration
	window time.Duration
	limit  uint64
	cfg    simConfig

	srvs   []*rlqs.Server // Envoy i streams to srvs[i%len(srvs)], else the next alive
	dead   []bool         // srvs[k] is down: its streams cut, none opened
	svc    *service.Service
	store  *redisstore.Store
	redis  *redistest.Server
	envoys []*rlqstest.Envoy
	links  []*link // the open stream of each Envoy, nil when none
	cut    []bool  // Envoy i's stream is down and cannot be opened
	queue  []delivery
	// admitted counts allowed requests (RLQS and RLS) by window start.
	admitted map[time.Time]uint64
	demand   map[time.Time]uint64
	rls      map[time.Time]uint64
	// granted counts the hits of grants by the window they were taken
	// in (give-backs deducted): what RLQS admissions must stay within.
	granted map[time.Time]int64
	// tbWindow is, per Envoy, the window the token bucket it was last
	// sent was granted in; stale counts requests admitted from a token
	// bucket in a later window than its grant's.
	tbWindow []time.Time
	stale    int
	// byEnvoy counts each Envoy's admitted requests by window.
	byEnvoy []map[time.Time]uint64
	// besideAdmitted and besideDemand count the bucket beside (another
	// counter of the same rule) by window.
	besideAdmitted, besideDemand map[time.Time]uint64
	// granting records, per Envoy, when an assignment reached it and
	// from which instance.
	granting [][]grantAt
}

// grantAt is an assignment reaching an Envoy: when, from which instance.
type grantAt struct {
	at  time.Time
	srv int
}

// at runs f at virtual time t (at the first step not before it).
func (s *sim) at(t time.Time, f func()) { s.queue = append(s.queue, delivery{at: t, f: f}) }

// cutStream ends Envoy i's stream and keeps it from opening another until
// restore.
func (s *sim) cutStream(i int) {
	s.cut[i] = true
	if l := s.links[i]; l != nil && !l.down {
		l.Close()
		l.closed(errors.New("stream cut"))
	}
}

// killServer takes srvs[k] down: its streams end, and their Envoys
// reopen theirs on the next server alive, as behind a load balancer.
func (s *sim) killServer(k int) {
	s.dead[k] = true
	for _, l := range s.links {
		if l != nil && !l.down && l.srv == k {
			l.Close()
			l.closed(errors.New("server gone"))
		}
	}
}

// tokenStats sums what assignments did to the tokens the Envoys held.
func (s *sim) tokenStats() (revoked, scaledAway, replaced float64) {
	for _, e := range s.envoys {
		st := e.Stats()
		revoked, scaledAway, replaced = revoked+st.Revoked, scaledAway+st.ScaledAway, replaced+st.Replaced
	}
	return revoked, scaledAway, replaced
}

// checkTokens fails when an assignment revoked tokens an Envoy held or
// gave it less of a grant than was taken for it.
func (s *sim) checkTokens(t *testing.T, name string) {
	t.Helper()
	revoked, scaled, _ := s.tokenStats()
	if revoked > 0 || scaled > 0 {
		t.Errorf("%s: %.1f tokens revoked, %.1f scaled away", name, revoked, scaled)
	}
}

// check runs checkPaid, checkTokens and checkUse on every window, and
// returns the windows' admitted/demanded counts.
func (s *sim) check(t *testing.T, name string) string {
	t.Helper()
	s.checkPaid(t, name)
	s.checkTokens(t, name)
	var used []string
	for i, w := range s.windows() {
		s.checkUse(t, name, i, w)
		used = append(used, fmt.Sprintf("%d/%d", s.admitted[w], s.demand[w]))
	}
	return strings.Join(used, " · ")
}

// checkUse fails window i (starting at w) when it admitted more than the
// limit, or, past the first window (the buckets' first reports and
// measurements), less than 97 % of the limit when the demand was over
// it, or less than 95 % of the demand when it was not.
func (s *sim) checkUse(t *testing.T, name string, i int, w time.Time) {
	t.Helper()
	got, demand := s.admitted[w], s.demand[w]
	switch {
	case got > s.limit:
		t.Errorf("%s: window %d admitted %d, more than the limit %d", name, i, got, s.limit)
	case i == 0:
	case demand > s.limit && float64(got) < 0.97*float64(s.limit):
		t.Errorf("%s: window %d admitted %d of a demand of %d: under 97 %% of the limit %d", name, i, got, demand, s.limit)
	case demand <= s.limit && float64(got) < 0.95*float64(demand):
		t.Errorf("%s: window %d admitted %d of %d: under 95 %% of the demand", name, i, got, demand)
	}
}

// countingGranter is the store, counting grants by window for the sim.
type countingGranter struct {
	s     *sim
	inner rlqs.Granter
}

func (g countingGranter) Grant(ctx context.Context, ops []limit.GrantOp) ([]limit.GrantResult, error) {
	res, err := g.inner.Grant(ctx, ops)
	for i, r := range res {
		if !strings.Contains(ops[i].Check.Key, "acme") {
			continue // the bucket beside: another counter
		}
		w := time.UnixMicro(r.WindowEndUS - ops[i].Check.WindowUS)
		if ops[i].GiveBack {
			w = time.UnixMicro(ops[i].WindowEndUS - ops[i].Check.WindowUS)
			g.s.granted[w] -= int64(r.Hits)
		} else {
			g.s.granted[w] += int64(r.Hits)
		}
	}
	return res, err
}

// checkPaid fails when Envoys admitted more in a window than the grants
// taken in it: tokens outliving their window.
func (s *sim) checkPaid(t *testing.T, name string) {
	t.Helper()
	if s.stale > 0 {
		t.Errorf("%s: %d requests admitted from token buckets granted in an earlier window", name, s.stale)
	}
	for i, w := range s.windows() {
		if got := int64(s.admitted[w] - s.rls[w]); got > s.granted[w] {
			t.Errorf("%s: window %d: Envoys admitted %d, more than the %d hits granted in it", name, i, got, s.granted[w])
		}
	}
}

type delivery struct {
	at time.Time
	f  func()
}

// link is an in-process stream: a session of the server, fed the
// Envoy's reports on the fake clock.
type link struct {
	s       *sim
	idx     int
	srv     int
	ss      *rlqs.Session
	deliver func(*rlqsv3.RateLimitQuotaResponse)
	closed  func(error)
	down    bool
	// The latest a report reaches the server and an answer the Envoy
	// (with jitter): a stream keeps its messages in order.
	reportAt, answerAt time.Time
}

func (l *link) Send(r *rlqsv3.RateLimitQuotaUsageReports) error {
	if l.down {
		return errors.New("stream down")
	}
	report := func() {
		if l.down {
			return
		}
		resp, err := l.ss.Report(context.Background(), l.s.now, r)
		if err != nil {
			l.s.t.Fatalf("report refused: %v", err)
		}
		l.s.send(l, resp)
	}
	if l.s.cfg.jitter == nil {
		report()
		return nil
	}
	// The report reaches the server up to a second late, after the ones
	// sent before it.
	l.reportAt = later(l.s.now.Add(time.Duration(l.s.cfg.jitter.Int64N(int64(time.Second)))), l.reportAt)
	l.s.at(l.reportAt, report)
	return nil
}

// later returns the later of a and b.
func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

func (l *link) Close() {
	if !l.down {
		l.down = true
		l.ss.Close()
	}
}

func (s *sim) send(l *link, resp *rlqsv3.RateLimitQuotaResponse) {
	if resp == nil {
		return
	}
	asked := s.now.Truncate(s.window)
	tb := false
	for _, a := range resp.GetBucketAction() {
		tb = tb || a.GetQuotaAssignmentAction().GetRateLimitStrategy().GetTokenBucket() != nil
	}
	at := s.now.Add(s.delta)
	if s.cfg.jitter != nil {
		// Up to the margin late (the bound's condition: an assignment
		// applied within --rlqs-margin), after the answers before it.
		at = later(s.now.Add(time.Duration(s.cfg.jitter.Int64N(int64(rlqs.DefaultMargin-s.step)))), l.answerAt)
		l.answerAt = at
	}
	s.queue = append(s.queue, delivery{at: at, f: func() {
		if !l.down {
			l.deliver(resp)
			if tb {
				s.tbWindow[l.idx] = asked
			}
			if len(resp.GetBucketAction()) > 0 {
				s.granting[l.idx] = append(s.granting[l.idx], grantAt{s.now, l.srv})
			}
		}
	}})
}

type simConfig struct {
	envoys int
	shares []float64 // of the demand, per Envoy; nil: even
	demand float64   // total, in multiples of the limit's rate
	// burst, when set, multiplies the demand at a time.
	burst    func(at time.Time) float64
	settings func(domain string) rlqstest.Settings
	rlsRate  float64 // ShouldRateLimit calls per second on the same rule
	window   time.Duration
	limit    uint64
	failDeny bool // the rule's failure_mode
	servers  int  // ratelimitd instances sharing the Redis (0: one)
	// beside is the demand on another counter of the rule (the bucket
	// besideID, every Envoy), in multiples of the limit's rate.
	beside float64
	// jitter, when set, delays each report by up to a second and each
	// answer by up to --rlqs-margin, at random, instead of δ.
	jitter *rand.Rand
	// redis, when set, is a redis-server of the caller's to use (and
	// flush) instead of one of the sim's own.
	redis *redistest.Server
}

const simRules = `
domain: edge
rlqs: {descriptor_keys: [tenant]}
descriptors:
  - key: tenant
    failure_mode: %s
    rate_limit: {unit: minute, requests_per_unit: %d}
`

func newSim(t testing.TB, cfg simConfig) *sim {
	t.Helper()
	unit := "minute"
	if cfg.window == 0 {
		cfg.window = time.Minute
	}
	if cfg.window == time.Hour {
		unit = "hour"
	}
	failure := "allow"
	if cfg.failDeny {
		failure = "deny"
	}
	rules := strings.Replace(fmt.Sprintf(simRules, failure, cfg.limit), "minute", unit, 1)
	if cfg.window < time.Minute {
		rules = strings.Replace(rules, "unit: minute", fmt.Sprintf("unit: second, unit_multiplier: %d", int(cfg.window/time.Second)), 1)
	}
	snap, err := config.Parse("rules.yaml", []byte(rules))
	if err != nil {
		t.Fatal(err)
	}
	// Start off a window boundary: Envoys report every 5 s from their
	// first request, so grants are then asked for at every fraction of a
	// second before a window's end.
	start := time.Unix(1_800_000_000, 0).Truncate(cfg.window).Add(700 * time.Millisecond)
	s := &sim{t: t, cfg: cfg, now: start, step: 100 * time.Millisecond, delta: 500 * time.Millisecond, window: cfg.window, limit: cfg.limit,
		admitted: map[time.Time]uint64{}, demand: map[time.Time]uint64{}, rls: map[time.Time]uint64{}, granted: map[time.Time]int64{},
		besideAdmitted: map[time.Time]uint64{}, besideDemand: map[time.Time]uint64{}}
	s.redis = cfg.redis
	if s.redis == nil {
		s.redis = redistest.Start(t)
	} else if err := s.redis.Client().FlushAll(context.Background()).Err(); err != nil {
		t.Fatal(err) // a redis-server of the caller's, started for this
	}
	s.store, err = redisstore.New(redisstore.Options{URL: s.redis.URL(), Timeout: time.Second, ScriptTime: func() time.Time { return s.now },
		BreakerOpenAfter: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.store.Close() })
	s.svc = service.New(snap, s.store, nil, service.Options{Now: func() time.Time { return s.now }})
	for range max(1, cfg.servers) {
		s.srvs = append(s.srvs, rlqs.New(s.svc, countingGranter{s, s.store}, rlqs.Options{Now: func() time.Time { return s.now }, Metrics: rlqs.NewMetrics(prometheus.NewRegistry())}))
		s.dead = append(s.dead, false)
	}
	for i := range cfg.envoys {
		s.cut = append(s.cut, false)
		s.tbWindow = append(s.tbWindow, time.Time{})
		s.byEnvoy = append(s.byEnvoy, map[time.Time]uint64{})
		s.granting = append(s.granting, nil)
		s.links = append(s.links, nil)
		e := rlqstest.New(cfg.settings("edge"), func(deliver func(*rlqsv3.RateLimitQuotaResponse), closed func(error)) (rlqstest.Conn, error) {
			if s.cut[i] {
				return nil, errors.New("connection refused")
			}
			k := i % len(s.srvs)
			for n := 0; s.dead[k]; n++ {
				if n == len(s.srvs) {
					return nil, errors.New("connection refused")
				}
				k = (k + 1) % len(s.srvs)
			}
			ss, err := s.srvs[k].NewSession()
			if err != nil {
				return nil, err
			}
			l := &link{s: s, idx: i, srv: k, ss: ss, deliver: deliver, closed: closed}
			s.links[i] = l
			return l, nil
		})
		s.envoys = append(s.envoys, e)
	}
	return s
}

var (
	bucketID = map[string]string{"tenant": "acme", "route": "checkout"}
	besideID = map[string]string{"tenant": "beta"}
)

// run advances the fleet by d, to the last window boundary before it.
func (s *sim) run(d time.Duration) { s.runUntil(s.now.Add(d).Truncate(s.window)) }

// runUntil advances the fleet to end, a step at a time: responses due
// are delivered, sessions woken, Envoys ticked, and requests arrive at
// each Envoy at its share of the demand.
func (s *sim) runUntil(end time.Time) {
	cfg := s.cfg
	rate := cfg.demand * float64(cfg.limit) / cfg.window.Seconds()
	owed := make([]float64, len(s.envoys))
	besideOwed := make([]float64, len(s.envoys))
	var rlsOwed float64
	for s.now.Add(s.step).Before(end) {
		s.now = s.now.Add(s.step)
		// What runs may queue more (a report's answer): it goes after.
		queued, due := s.queue, s.queue[:0:0]
		s.queue = nil
		for _, q := range queued {
			if q.at.After(s.now) {
				due = append(due, q)
				continue
			}
			q.f()
		}
		s.queue = append(due, s.queue...)
		for _, l := range s.links {
			if l != nil && !l.down {
				if w := l.ss.NextWake(); !w.IsZero() && !w.After(s.now) {
					s.send(l, l.ss.Wake(context.Background(), s.now))
				}
			}
		}
		win := s.now.Truncate(s.window) // as the store counts: a request at a window's start is its
		for i, e := range s.envoys {
			e.Tick(s.now)
			share := 1 / float64(len(s.envoys))
			if cfg.shares != nil {
				share = cfg.shares[i]
			}
			r := rate * share
			if cfg.burst != nil {
				r *= cfg.burst(s.now)
			}
			besideOwed[i] += cfg.beside * float64(cfg.limit) / cfg.window.Seconds() / float64(len(s.envoys)) * s.step.Seconds()
			for ; besideOwed[i] >= 1; besideOwed[i]-- {
				s.besideDemand[win]++
				if e.Request(s.now, besideID) {
					s.besideAdmitted[win]++
				}
			}
			owed[i] += r * s.step.Seconds()
			for ; owed[i] >= 1; owed[i]-- {
				s.demand[win]++
				if e.Request(s.now, bucketID) {
					s.admitted[win]++
					s.byEnvoy[i][win]++
					if e.Strategy(bucketID) == "token_bucket" && !s.tbWindow[i].Equal(win) {
						s.stale++
					}
				}
			}
		}
		for rlsOwed += cfg.rlsRate * s.step.Seconds(); rlsOwed >= 1; rlsOwed-- {
			resp, err := s.svc.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "edge",
				Descriptors: []*rlcommon.RateLimitDescriptor{{Entries: []*rlcommon.RateLimitDescriptor_Entry{{Key: "tenant", Value: "acme"}}}}})
			if err != nil {
				s.t.Fatal(err)
			}
			if resp.GetOverallCode() == rlsv3.RateLimitResponse_OK {
				s.admitted[win]++
				s.rls[win]++
			}
		}
	}
}

// windows returns the admitted counts of the windows run, in order.
func (s *sim) windows() (starts []time.Time) {
	for w := range s.admitted {
		starts = append(starts, w)
	}
	sort.Slice(starts, func(i, j int) bool { return starts[i].Before(starts[j]) })
	return starts
}

func (s *sim) close() {
	for _, e := range s.envoys {
		e.Close()
	}
}
