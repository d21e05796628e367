package rlqs_test

// The fleet simulation's tests: the bound over instances, delays and
// failures.

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/internal/limit"
	"github.com/ratelimitd/ratelimitd/internal/redisstore/redistest"
	"github.com/ratelimitd/ratelimitd/internal/rlqs"
	"github.com/ratelimitd/ratelimitd/internal/rlqs/rlqstest"
	"github.com/ratelimitd/ratelimitd/internal/starve"
)

// TestFleetBound: with Envoy's strict configuration, a fleet of 1, 3 or
// 10 Envoys, with even or skewed traffic, at half, once and three times
// the limit, never admits more than the limit in a window, and uses it
// (checkUse): every window after the first uses 97 % of the limit at
// three times, 95 % of the demand at once and under. No tokens an Envoy
// holds are revoked or scaled away.
func TestFleetBound(t *testing.T) {
	const limit = 600
	var table []string
	for _, n := range []int{1, 3, 10} {
		for _, skew := range []bool{false, true} {
			if n == 1 && skew {
				continue
			}
			for _, demand := range []float64{0.5, 1, 3} {
				cfg := simConfig{envoys: n, demand: demand, settings: rlqstest.Strict, limit: limit}
				if skew {
					cfg.shares = skewed(n)
				}
				name := fmt.Sprintf("%d envoys %s %.1fx", n, map[bool]string{false: "even", true: "skewed"}[skew], demand)
				s := newSim(t, cfg)
				s.run(4 * time.Minute)
				s.close()
				table = append(table, fmt.Sprintf("| %s | %s |", name, s.check(t, name)))
			}
		}
	}
	t.Logf("admitted/demanded per minute window, limit %d, strict config, δ 0.5 s:\n%s", limit, strings.Join(table, "\n"))
}

// TestFleetBoundAtWindowEnd: windows under the limit, where Envoys end
// holding grants, alternate with windows over it, filled from their
// start: a grant living past its window's end would show as a full
// window over the limit.
func TestFleetBoundAtWindowEnd(t *testing.T) {
	const limit = 600
	for _, n := range []int{1, 3, 10} {
		cfg := simConfig{envoys: n, demand: 0.9, settings: rlqstest.Strict, limit: limit,
			burst: func(at time.Time) float64 {
				if at.Unix()/60%2 == 1 {
					return 4
				}
				return 1
			}}
		s := newSim(t, cfg)
		s.run(6 * time.Minute)
		s.close()
		t.Logf("%d envoys, 0.9x and 3.6x windows in turn: %s", n, s.check(t, fmt.Sprintf("%d envoys", n)))
	}
}

// TestFleetOverInstances: Envoys spread over three ratelimitd instances
// on one Redis (each knows only its own streams' demand) stay within the
// limit as one fleet and use it, and so they do when an instance dies
// (at three moments of the Envoys' report period) and its Envoys reopen
// their streams on the others: each is re-assigned within a report
// period and 3 s of the kill, by a grant that replaces whole what the
// dead one had granted, so no token is revoked or scaled away.
func TestFleetOverInstances(t *testing.T) {
	const limit = 600
	for _, tc := range []struct {
		demand float64
		kill   time.Duration // into the run; 0: none
	}{{1, 0}, {3, 0}, {1, 90 * time.Second}, {3, 90 * time.Second}, {1, 92500 * time.Millisecond}, {1, 94900 * time.Millisecond}} {
		cfg := simConfig{envoys: 10, servers: 3, demand: tc.demand, settings: rlqstest.Strict, limit: limit}
		s := newSim(t, cfg)
		name := fmt.Sprintf("10 envoys over 3 instances, %.0fx", tc.demand)
		killed := s.now.Truncate(time.Minute).Add(tc.kill)
		if tc.kill > 0 {
			name += fmt.Sprintf(", one killed at %v", tc.kill)
			s.at(killed, func() { s.killServer(1) })
		}
		s.run(4 * time.Minute)
		s.close()
		used := s.check(t, name)
		if tc.kill > 0 {
			if st := s.envoys[1].Stats(); st.Dials < 2 {
				t.Errorf("%s: Envoy 1 opened %d streams: the kill cut nothing", name, st.Dials)
			}
			used += "; re-assigned after " + s.checkReassigned(t, name, 1, killed)
		}
		t.Logf("%s: %s", name, used)
	}
}

// checkReassigned fails when an Envoy whose stream was on srvs[dead],
// killed at killed, got its first assignment from another instance more
// than a report period and 3 s later, and returns the times.
func (s *sim) checkReassigned(t *testing.T, name string, dead int, killed time.Time) string {
	t.Helper()
	var took []string
	for i, gs := range s.granting {
		if i%len(s.srvs) != dead {
			continue
		}
		j := slices.IndexFunc(gs, func(g grantAt) bool { return g.srv != dead && !g.at.Before(killed) })
		if j < 0 {
			t.Errorf("%s: Envoy %d got no assignment after the kill", name, i)
			continue
		}
		d := gs[j].at.Sub(killed)
		took = append(took, fmt.Sprintf("%.1f s", d.Seconds()))
		if d > rlqs.ReportPeriod+3*time.Second {
			t.Errorf("%s: Envoy %d re-assigned %v after the kill, more than a report period and 3 s", name, i, d)
		}
	}
	return strings.Join(took, ", ")
}

// TestRLSAndRLQSShareTheLimit: ShouldRateLimit callers and RLQS Envoys on
// one rule together never exceed it, and share it by demand: grants leave
// the RLS callers their share of what remains, measured from their calls,
// so with short windows too, neither gets under 90 % of its share (the
// limit split by demand, or its whole demand when that is less). RLS
// callers are decided by the counter alone: calling while it has room,
// they may take more than their share.
func TestRLSAndRLQSShareTheLimit(t *testing.T) {
	for _, window := range []time.Duration{20 * time.Second, time.Minute} {
		for _, rlsRate := range []float64{2, 10} {
			limit := uint64(10 * window / time.Second) // 10 a second
			cfg := simConfig{envoys: 3, demand: 2, settings: rlqstest.Strict, limit: limit, rlsRate: rlsRate, window: window}
			s := newSim(t, cfg)
			s.run(3 * time.Minute)
			s.close()
			name := fmt.Sprintf("%v windows, RLS at %v/s", window, rlsRate)
			s.checkTokens(t, name)
			rlsDemand := rlsRate * window.Seconds()
			var used []string
			for i, w := range s.windows() {
				s.checkUse(t, name, i, w)
				rls, rlqs := float64(s.rls[w]), float64(s.admitted[w]-s.rls[w])
				total := rlsDemand + float64(s.demand[w])
				rlsFair := min(rlsDemand, float64(limit)*rlsDemand/total)
				rlqsFair := min(float64(s.demand[w]), float64(limit)*float64(s.demand[w])/total)
				if i > 0 && (rls < 0.9*rlsFair || rlqs < 0.9*rlqsFair) {
					t.Errorf("%s, window %d: RLS admitted %.0f (share %.0f), RLQS %.0f (share %.0f)", name, i, rls, rlsFair, rlqs, rlqsFair)
				}
				used = append(used, fmt.Sprintf("%d+%d", s.rls[w], s.admitted[w]-s.rls[w]))
			}
			t.Logf("%s, limit %d: RLS+RLQS admitted per window: %s", name, limit, strings.Join(used, " · "))
		}
	}
}

// TestPermissiveOvershoot measures what Envoy's defaults (ALLOW_ALL
// before an assignment and once one expires) admit past the limit. A new
// bucket admits everything until its first assignment arrives; an Envoy
// whose grant expired (--rlqs-margin before its window ends) admits
// everything until the next window's grant reaches it (δ after the window
// starts); and an Envoy that lost its stream admits everything from when
// its last assignment expires until it is back. The steady case is held
// to its bound, the others are reported.
func TestPermissiveOvershoot(t *testing.T) {
	const limit = 600
	permissive := func(domain string) rlqstest.Settings { return rlqstest.Settings{Domain: domain} }
	alternate := func(at time.Time) float64 {
		if at.Unix()/60%2 == 1 {
			return 4
		}
		return 1
	}
	var rows []string
	for _, tc := range []struct {
		name   string
		cfg    simConfig
		cut    bool
		steady bool
	}{
		{"1 envoy, 3x", simConfig{envoys: 1, demand: 3}, false, true},
		{"10 envoys, 3x", simConfig{envoys: 10, demand: 3}, false, true},
		{"3 envoys, 0.9x and 3.6x in turn", simConfig{envoys: 3, demand: 0.9, burst: alternate}, false, false},
		{"3 envoys, 2x, one stream lost for 80 s", simConfig{envoys: 3, demand: 2}, true, false},
	} {
		cfg := tc.cfg
		cfg.settings, cfg.limit = permissive, limit
		s := newSim(t, cfg)
		if tc.cut {
			t0 := s.now.Truncate(time.Minute)
			s.at(t0.Add(70*time.Second), func() { s.cutStream(0) })
			s.at(t0.Add(150*time.Second), func() { s.cut[0] = false })
		}
		s.run(4 * time.Minute)
		s.close()
		rate := cfg.demand * limit / s.cfg.window.Seconds()
		// Margin + δ + a step of the simulation, at the whole demand.
		bound := uint64(math.Ceil(rate * (rlqs.DefaultMargin + s.delta + 2*s.step).Seconds()))
		var cells []string
		worst := int64(math.MinInt64)
		for i, w := range s.windows() {
			over := int64(s.admitted[w]) - limit
			cells = append(cells, fmt.Sprintf("%+d", over))
			worst = max(worst, over)
			if tc.steady && i > 0 && s.admitted[w] > limit+bound {
				t.Errorf("%s, window %d: %d admitted, more than the limit and the documented %d", tc.name, i, s.admitted[w], bound)
			}
		}
		if tc.cut && worst <= 0 {
			t.Errorf("%s: no overshoot measured: the lost stream's Envoy should admit all once its assignment expired", tc.name)
		}
		rows = append(rows, fmt.Sprintf("| %s | %s |", tc.name, strings.Join(cells, " · ")))
	}
	t.Logf("permissive defaults, limit %d a minute: admitted over (+) or under (-) the limit, per window:\n%s", limit, strings.Join(rows, "\n"))
}

// TestStreamLoss: an Envoy whose stream is cut keeps its grant until the
// assignment expires, then denies (strict), while the others go on; it
// reopens the stream at the first report after the server is reachable
// again and is granted again. The fleet stays within the limit.
func TestStreamLoss(t *testing.T) {
	const limit = 600
	cfg := simConfig{envoys: 3, demand: 2, settings: rlqstest.Strict, limit: limit}
	s := newSim(t, cfg)
	t0 := s.now.Truncate(time.Minute)
	s.at(t0.Add(70*time.Second), func() { s.cutStream(0) })
	s.at(t0.Add(190*time.Second), func() { s.cut[0] = false })
	s.run(4 * time.Minute)
	s.close()
	s.checkPaid(t, "stream loss")
	for i, w := range s.windows() {
		if got := s.admitted[w]; got > limit {
			t.Errorf("window %d: %d admitted, more than %d", i, got, limit)
		}
		t.Logf("window %d: %d admitted, Envoy 0 %d", i, s.admitted[w], s.byEnvoy[0][w])
	}
	if got := s.byEnvoy[0][t0.Add(2*time.Minute)]; got != 0 {
		t.Errorf("Envoy 0 admitted %d in the window after its stream was cut, before it came back: its grant outlived its window", got)
	}
	if s.byEnvoy[0][t0.Add(3*time.Minute)] == 0 {
		t.Error("Envoy 0 admitted nothing once its stream was back")
	}
	if st := s.envoys[0].Stats(); st.Dials < 2 || st.Dropped == 0 {
		t.Errorf("Envoy 0 stats %+v: want reports dropped while cut and a second stream", st)
	}
	if s.byEnvoy[1][t0.Add(2*time.Minute)] == 0 {
		t.Error("the other Envoys stopped too")
	}
}

// TestRedisDown: while Redis is down the rule's failure mode answers
// (allow: ALLOW_ALL, deny: DENY_ALL, for FailureTTL, renewed at each
// report); when it is back, grants replace them at the next report.
func TestRedisDown(t *testing.T) {
	const limit = 600
	for _, deny := range []bool{false, true} {
		cfg := simConfig{envoys: 2, demand: 2, settings: rlqstest.Strict, limit: limit, failDeny: deny}
		s := newSim(t, cfg)
		t0 := s.now.Truncate(time.Minute)
		s.at(t0.Add(60*time.Second), func() { s.redis.Kill() })
		s.at(t0.Add(120*time.Second), func() { s.restartRedis() })
		s.run(4 * time.Minute)
		s.close()
		// The window Redis comes back in still sees failure-mode answers
		// given before (fail open is uncounted, as for ShouldRateLimit);
		// the next is decided by grants alone.
		down, after := s.admitted[t0.Add(time.Minute)], s.admitted[t0.Add(3*time.Minute)]
		demand := s.demand[t0.Add(time.Minute)]
		t.Logf("failure_mode deny=%v: window with Redis down: %d of %d admitted; after: %d", deny, down, demand, after)
		switch {
		case !deny && float64(down) < 0.9*float64(demand):
			t.Errorf("failure_mode allow: %d of %d admitted while Redis was down, want nearly all", down, demand)
		case deny && down > 0:
			t.Errorf("failure_mode deny: %d admitted while Redis was down (the previous window's grants expire before it)", down)
		}
		if after == 0 || after > limit {
			t.Errorf("after Redis came back: %d admitted, want grants again within the limit", after)
		}
	}
}

// restartRedis restarts the redis-server and waits, in real time, for the
// store to reach it again (go-redis redials a refused address at most
// once a second), while the fake clock stands still.
func (s *sim) restartRedis() {
	s.redis.Restart()
	probe := []limit.GrantOp{{Check: limit.Check{Key: "probe", Limit: 1, WindowUS: 1e6}}}
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, err := s.store.Grant(context.Background(), probe); err == nil {
			return
		}
		if time.Now().After(deadline) {
			s.t.Fatal("the store does not reach the restarted redis-server")
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestAbandonIdle: a bucket without requests for IdleAfter is abandoned;
// its next request makes it new, reported at once, and granted.
func TestAbandonIdle(t *testing.T) {
	cfg := simConfig{envoys: 1, demand: 1, settings: rlqstest.Strict, limit: 600}
	var start time.Time
	cfg.burst = func(at time.Time) float64 {
		if off := at.Sub(start); off > 20*time.Second && off < 100*time.Second {
			return 0
		}
		return 1
	}
	s := newSim(t, cfg)
	start = s.now
	s.runUntil(start.Add(90 * time.Second))
	e := s.envoys[0]
	if e.Buckets() != 0 {
		t.Fatalf("Envoy still holds %d buckets after 60 s idle", e.Buckets())
	}
	before := e.Stats()
	s.runUntil(start.Add(150 * time.Second))
	s.close()
	after := e.Stats()
	if e.Buckets() != 1 || after.Reports <= before.Reports {
		t.Fatalf("the bucket did not come back: %d buckets, stats %+v", e.Buckets(), after)
	}
	if after.Allowed-before.Allowed < 50 {
		t.Errorf("only %d admitted after the bucket came back: no grant", after.Allowed-before.Allowed)
	}
}

// TestFleetBoundUnderDelays is the bound as a property: fleets drawn at
// random (1-5 Envoys, even or 70 % on one, over one to three instances;
// half, once or three times the limit, or 0.9 and 3.6 times it in turn;
// ShouldRateLimit callers beside
// them at none, a fifth or the whole of the limit's rate; a bucket of
// another counter beside, or none; 20 s or minute windows), every report
// reaching the server up to a second late and every answer reaching the
// Envoy up to --rlqs-margin late, at random, with the machine kept busy
// (the store's timeouts are real: failure_mode deny refuses what they
// cut). Every window of every counter admits at most the limit, RLQS
// and RLS together, no Envoy admits more than was granted in a window,
// and no assignment takes away a token an Envoy holds; over at least 200
// windows. The seed is logged.
func TestFleetBoundUnderDelays(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 0))
	starve.Loops(t, runtime.NumCPU())
	windows := 0
	for run := 0; windows < 200; run++ {
		window := []time.Duration{20 * time.Second, time.Minute}[rng.IntN(2)]
		limit := uint64(10 * window / time.Second) // 10 a second
		cfg := simConfig{envoys: 1 + rng.IntN(5), demand: []float64{0.5, 1, 3}[rng.IntN(3)], settings: rlqstest.Strict,
			limit: limit, window: window, failDeny: true, servers: 1 + rng.IntN(3), beside: []float64{0, 0.5}[rng.IntN(2)],
			rlsRate: []float64{0, 2, 10}[rng.IntN(3)], jitter: rand.New(rand.NewPCG(seed, uint64(run)+1))}
		if cfg.envoys > 1 && rng.IntN(2) == 0 {
			cfg.shares = skewed(cfg.envoys)
		}
		alternate := rng.IntN(2) == 0
		if alternate {
			// Windows under the limit, where Envoys end holding grants,
			// and windows over it in turn.
			cfg.demand = 0.9
			cfg.burst = func(at time.Time) float64 { return float64(1 + 3*(at.UnixNano()/int64(window)%2)) }
		}
		name := fmt.Sprintf("run %d: %d envoys over %d instances, %.1fx (alternating with 4 times that: %v), RLS %v/s, beside %.1fx, %v windows, shares %v",
			run, cfg.envoys, cfg.servers, cfg.demand, alternate, cfg.rlsRate, cfg.beside, window, cfg.shares)
		s := newSim(t, cfg)
		s.run(200 * time.Second)
		s.close()
		s.checkPaid(t, name)
		s.checkTokens(t, name)
		for i, w := range s.windows() {
			if got := s.admitted[w]; got > limit {
				t.Errorf("%s: window %d admitted %d (RLS %d), more than %d", name, i, got, s.rls[w], limit)
			}
			if got := s.besideAdmitted[w]; got > limit {
				t.Errorf("%s: window %d admitted %d of the bucket beside, more than %d", name, i, got, limit)
			}
			windows++
		}
		if t.Failed() {
			return
		}
	}
	t.Logf("%d windows", windows)
}

// TestFleetUseOverInstancesUnderDelays: Envoys spread over three
// instances, 70 % of the demand on one, three times the limit (every
// other seed with a bucket of another counter beside, at half its
// limit), reports up to a second late and answers up to --rlqs-margin
// late (fixed seeds, the sim's clock: nothing here depends on the
// machine's speed). Every window after the first uses at least 97 % of
// the limit, none more, and no held token is taken away: each instance
// sees one Envoy's demand of several, and a grant replaced while it
// still held tokens lost them to the window (Envoy drops them with the
// bucket), which left windows at 94 %.
func TestFleetUseOverInstancesUnderDelays(t *testing.T) {
	const limit = 600
	srv := redistest.Start(t)
	windows := 0
	for seed := range uint64(8) {
		for _, n := range []int{3, 10} {
			cfg := simConfig{envoys: n, shares: skewed(n), demand: 3, settings: rlqstest.Strict, limit: limit, servers: 3,
				beside: float64(seed%2) / 2, jitter: rand.New(rand.NewPCG(seed, 37)), redis: srv}
			name := fmt.Sprintf("%d envoys skewed over 3 instances, 3x, a bucket beside at %.1fx, seed %d", n, cfg.beside, seed)
			s := newSim(t, cfg)
			s.run(5 * time.Minute)
			s.close()
			s.checkPaid(t, name)
			s.checkTokens(t, name)
			for i, w := range s.windows() {
				s.checkUse(t, name, i, w)
				windows++
			}
		}
	}
	t.Logf("%d windows", windows)
}

// skewed is 70 % of the demand on the first of n Envoys, the rest even.
func skewed(n int) []float64 {
	shares := make([]float64, n)
	shares[0] = 0.7
	for i := 1; i < n; i++ {
		shares[i] = 0.3 / float64(n-1)
	}
	return shares
}

// BenchmarkFleetUseUnderDelays measures what the fleet uses of the limit
// when reports reach the server up to a second late and answers reach
// the Envoys up to --rlqs-margin late, at random: 1, 3 or 10 Envoys, even
// or 70 % on one, with or without a bucket of another counter beside
// (half its limit), over one instance or three, offered half, once and
// three times the limit, minute windows of 600, five of them. It reports
// the worst window after the first: of the limit at three times it
// (use_3x), of the demand at once and half (use_le1x). The bound itself
// is TestFleetBoundUnderDelays'.
//
//	go test -run XXX -bench FleetUseUnderDelays -benchtime 4x ./internal/rlqs/
func BenchmarkFleetUseUnderDelays(b *testing.B) {
	const limit = 600
	srv := redistest.Start(b)
	worst3, worstLE1 := 1.0, 1.0
	var table []string
	for iter := range b.N {
		run := uint64(0)
		for _, n := range []int{1, 3, 10} {
			for _, skew := range []bool{false, true} {
				if n == 1 && skew {
					continue
				}
				for _, beside := range []float64{0, 0.5} {
					for _, demand := range []float64{0.5, 1, 3} {
						run++
						cfg := simConfig{envoys: n, demand: demand, settings: rlqstest.Strict, limit: limit, beside: beside,
							servers: 1 + 2*int(run%2), jitter: rand.New(rand.NewPCG(uint64(iter), run)), redis: srv}
						if skew {
							cfg.shares = skewed(n)
						}
						s := newSim(b, cfg)
						s.run(5 * time.Minute)
						s.close()
						var cells []string
						for i, w := range s.windows() {
							got, asked := float64(s.admitted[w]), float64(s.demand[w])
							cells = append(cells, fmt.Sprintf("%.0f/%.0f", got, asked))
							switch {
							case i == 0:
							case demand == 3:
								worst3 = min(worst3, got/limit)
							default:
								worstLE1 = min(worstLE1, got/asked)
							}
						}
						table = append(table, fmt.Sprintf("| %d envoys %s, beside %.1fx, %d instances, %.1fx | %s |", n,
							map[bool]string{false: "even", true: "skewed"}[skew], beside, cfg.servers, demand, strings.Join(cells, " · ")))
					}
				}
			}
		}
	}
	b.ReportMetric(worst3, "use_3x")
	b.ReportMetric(worstLE1, "use_le1x")
	b.Logf("admitted/demanded per minute window:\n%s", strings.Join(table, "\n"))
}
