package global_test

import (
	"context"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/ratelimitd/ratelimitd/internal/global"
	"github.com/ratelimitd/ratelimitd/internal/limit"
	"github.com/ratelimitd/ratelimitd/internal/redisstore"
)

// hourClock is a clock a second into an hour's window, moving as the
// machine's: a test on it never sees its budget's window turn.
func hourClock() func() time.Time {
	now := time.Now()
	offset := now.Truncate(time.Hour).Add(time.Hour + time.Second).Sub(now)
	return func() time.Time { return time.Now().Add(offset) }
}

// homeCount is the home counter of key: its window's count.
func homeCount(t *testing.T, w *world, key string) uint64 {
	t.Helper()
	raw, err := w.home.Client().Get(context.Background(), key).Result()
	if err != nil {
		t.Fatalf("the home counter %s: %v", key, err)
	}
	_, count, _ := strings.Cut(raw, ":")
	n, err := strconv.ParseUint(count, 10, 64)
	if err != nil {
		t.Fatalf("the home counter %s holds %q", key, raw)
	}
	return n
}

// budgetWorld is two regions of two instances on hourClock, 40 and 80
// ms from the home, calls to it failing after 300 ms: cuts fail calls
// whose answers are lost, and the calls are made again.
func budgetWorld(t *testing.T) (*world, *global.Metrics, func() time.Time) {
	clock := hourClock()
	m := global.NewMetrics(prometheus.NewRegistry())
	opts := global.Options{Refresh: 100 * time.Millisecond, HomeTimeout: 300 * time.Millisecond, OutAfter: 300 * time.Millisecond, Metrics: m, Now: clock}
	w := newWorldWith(t, 2, 2, func(i int) time.Duration { return time.Duration(40+40*i) * time.Millisecond }, 10*time.Millisecond,
		opts, func(o *redisstore.Options) { o.Timeout, o.ScriptTime = 300*time.Millisecond, clock })
	return w, m, clock
}

// cuts partitions a region at random from the home n times, for 400-900
// ms each, pause apart.
func cuts(w *world, seed uint64, n int, pause func(*rand.Rand) time.Duration) {
	rng := rand.New(rand.NewPCG(seed, seed+1))
	for range n {
		time.Sleep(pause(rng))
		r := w.regions[rng.IntN(len(w.regions))]
		r.wan.Partition()
		time.Sleep(time.Duration(400+rng.IntN(500)) * time.Millisecond)
		r.wan.Heal()
	}
}

func budgetCheck(key string, lim uint64, hits uint64, kind limit.UsageKind) limit.Check {
	return limit.Check{Key: key, Limit: lim, WindowUS: 3600e6, Hits: hits, Global: true, Usage: true, Kind: kind}
}

// TestGlobalBudgetChargesSettleOnce: streams on a global budget in two
// regions (a check, then up to a second later a charge of 50-800 tokens,
// 0, none at all, or one handed over with no time left), spending it
// halfway through, while regions are cut off from the home and healed. Every charge is counted at the home, once: the home's
// count is at least what was charged (nothing lost) and above it by no
// more than the hits drawn and never used or returned (a settle counted
// twice would add a whole settle).
func TestGlobalBudgetChargesSettleOnce(t *testing.T) {
	w, m, _ := budgetWorld(t)
	const key, lim = "g:budget", 100_000
	var charged, unkept atomic.Uint64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for ri, r := range w.regions {
		for ii, g := range r.instances {
			wg.Go(func() { stream(g, key, lim, rand.New(rand.NewPCG(uint64(ri), uint64(ii))), &charged, &unkept, stop) })
		}
	}
	cuts(w, 11, 3, func(rng *rand.Rand) time.Duration { return time.Duration(300+rng.IntN(300)) * time.Millisecond })
	time.Sleep(500 * time.Millisecond)
	close(stop)
	wg.Wait()
	w.close() // settles what is owed, gives back what is held
	got, x := homeCount(t, w, key), charged.Load()
	slack := uint64(testutil.ToFloat64(m.Hits.WithLabelValues("lost")) + testutil.ToFloat64(m.Hits.WithLabelValues("unanswered")))
	settled := testutil.ToFloat64(m.Hits.WithLabelValues("settled"))
	t.Logf("charged %d, counted at the home %d; drawn and never used or returned at most %d; settled %.0f", x, got, slack, settled)
	if got < x {
		t.Errorf("the home counted %d of %d charged: %d lost", got, x, x-got)
	}
	if got > x+slack {
		t.Errorf("the home counted %d of %d charged: %d more than the %d drawn and unused can explain (counted twice)", got, x, got-x-slack, slack)
	}
	if settled == 0 {
		t.Errorf("charged %d, settled %.0f: the test never charged beyond what was held", x, settled)
	}
	if n := unkept.Load(); n > 0 {
		t.Errorf("%d charges handed over with no time left were not kept", n)
	}
	for _, what := range []string{"expired", "abandoned"} {
		if n := testutil.ToFloat64(m.Hits.WithLabelValues(what)); n != 0 {
			t.Errorf("%.0f hits %s", n, what)
		}
	}
}

// stream starts streams on g's budget key until stop, one every 1-10
// ms: a budget check; if admitted, 20-1000 ms later, a charge of 50-800
// tokens (7 in 10), a charge of 0, nothing (a stream cancelled), or a
// charge its caller had no time to send (KeepCharges). So charges keep
// coming after the budget is spent, from streams admitted before.
// charged sums what was charged, unkept counts the charges KeepCharges
// did not take.
func stream(g *global.Store, key string, lim uint64, rng *rand.Rand, charged, unkept *atomic.Uint64, stop <-chan struct{}) {
	ctx := context.Background()
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		select {
		case <-stop:
			return
		case <-time.After(time.Duration(1+rng.IntN(10)) * time.Millisecond):
		}
		res, err := g.Evaluate(ctx, []limit.Check{budgetCheck(key, lim, 0, limit.ByHits)})
		if err != nil || res[0].Over {
			continue
		}
		took, n, r := time.Duration(20+rng.IntN(980))*time.Millisecond, uint64(50+rng.IntN(750)), rng.IntN(10)
		wg.Go(func() {
			time.Sleep(took)
			switch {
			case r < 7:
				if _, err := g.Evaluate(ctx, []limit.Check{budgetCheck(key, lim, n, limit.ByHits)}); err == nil {
					charged.Add(n)
				}
			case r == 7:
				_, _ = g.Evaluate(ctx, []limit.Check{budgetCheck(key, lim, 0, limit.ZeroCharge)})
			case r == 8:
			default:
				// A global charge never waits on a store: it is always
				// kept (spent here), never handed elsewhere.
				if g.KeepCharges([]limit.Check{budgetCheck(key, lim, n, limit.ByHits)}) {
					charged.Add(n)
				} else {
					unkept.Add(1)
				}
			}
		})
	}
}

// TestGlobalBudgetAnswers: a global budget answers as a region's does. A
// check (no hits) passes while something is left and is refused once the
// charges have spent it; a charge past what is left is over and recorded
// all the same; a stream end charging 0 is never refused; a request that
// costs its hit (a stated 1) is a plain request: a limit of 20 admits
// 20, all of them.
func TestGlobalBudgetAnswers(t *testing.T) {
	clock := hourClock()
	// A wait a crowded machine can meet: a fresh budget's first check
	// waits for a read of the home, and past the default 50 ms margin
	// it would be refused (waited_out) with the budget whole.
	w := newWorldWith(t, 1, 1, func(int) time.Duration { return 5 * time.Millisecond }, 0,
		global.Options{Refresh: 50 * time.Millisecond, Now: clock, ColdMargin: 3 * time.Second}, func(o *redisstore.Options) { o.ScriptTime = clock })
	g := w.regions[0].instances[0]
	ctx := context.Background()
	decide := func(c limit.Check) limit.Result {
		t.Helper()
		res, err := g.Evaluate(ctx, []limit.Check{c})
		if err != nil {
			t.Fatal(err)
		}
		return res[0]
	}
	const key, lim = "g:answers", 1000
	if r := decide(budgetCheck(key, lim, 0, limit.ByHits)); r.Over {
		t.Fatalf("a check on a fresh budget: %+v, want admitted", r)
	}
	if r := decide(budgetCheck(key, lim, 600, limit.ByHits)); r.Over {
		t.Errorf("a charge of 600 of 1000: %+v, want not over", r)
	}
	// The charge taught what a stream spends: a check now holds that
	// much of the grant (at most an eighth of the budget), once this
	// instance holds it: a draw away.
	deadline := time.Now().Add(5 * time.Second)
	for r := decide(budgetCheck(key, lim, 0, limit.ByHits)); r.Over; r = decide(budgetCheck(key, lim, 0, limit.ByHits)) {
		if time.Now().After(deadline) {
			t.Fatalf("a check with 400 left: %+v, want admitted within 5 s", r)
		}
		time.Sleep(10 * time.Millisecond)
	}
	// Other instances may hold what this one does not see: a charge is
	// over only on a budget known spent before it.
	if r := decide(budgetCheck(key, lim, 600, limit.ByHits)); r.Over || r.Remaining != 0 {
		t.Errorf("a charge of 600 with 400 left: %+v, want recorded, not over, nothing left", r)
	}
	if r := decide(budgetCheck(key, lim, 10, limit.ByHits)); !r.Over {
		t.Errorf("a charge on the spent budget: %+v, want over", r)
	}
	r := decide(budgetCheck(key, lim, 0, limit.ByHits))
	if !r.Over {
		t.Errorf("a check on the spent budget: %+v, want refused", r)
	}
	if reset := time.Duration(r.ResetUS) * time.Microsecond; reset < 50*time.Minute {
		t.Errorf("a check on the spent budget resets in %v, want the hour window's end (about 59 min)", reset)
	}
	if r := decide(budgetCheck(key, lim, 0, limit.ZeroCharge)); r.Over {
		t.Errorf("a stream end charging 0 on the spent budget: %+v, want not refused", r)
	}
	if r := decide(budgetCheck(key, lim, 1, limit.CostCheck)); !r.Over {
		t.Errorf("a request costing 1 on the spent budget: %+v, want refused", r)
	}
	admitted := 0
	deadline = time.Now().Add(10 * time.Second)
	for admitted < 20 && time.Now().Before(deadline) {
		if r := decide(budgetCheck("g:plain", 20, 1, limit.CostCheck)); !r.Over {
			admitted++
		} else {
			time.Sleep(10 * time.Millisecond) // a draw on its way
		}
	}
	for range 5 {
		if r := decide(budgetCheck("g:plain", 20, 1, limit.CostCheck)); !r.Over {
			admitted++
		}
	}
	if admitted != 20 {
		t.Errorf("a limit of 20 stated 1 a request admitted %d, want 20", admitted)
	}
	w.close()
	if n := homeCount(t, w, key); n != 1210 {
		t.Errorf("the budget counted %d at the home, want the 1210 charged", n)
	}
}

// TestSpentBudgetSettlesExactly: a global budget spent at the home before
// the test, so that nothing can be drawn and every charge is owed to the
// home: charges from streams admitted before (50-800 tokens, at random
// moments) reach it through cuts of each region's link, answers lost and
// calls retried, and the home counts exactly what was charged: nothing
// lost, nothing twice.
func TestSpentBudgetSettlesExactly(t *testing.T) {
	w, m, clock := budgetWorld(t)
	const key, lim = "g:spent", 1000
	home, err := redisstore.New(redisstore.Options{URL: w.home.URL(), Timeout: time.Second, ScriptTime: clock})
	if err != nil {
		t.Fatal(err)
	}
	defer home.Close()
	if _, err := home.Grant(context.Background(), []limit.GrantOp{{Check: budgetCheck(key, lim, lim, limit.ByHits)}}); err != nil {
		t.Fatal(err)
	}
	var charged atomic.Uint64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for ri, r := range w.regions {
		for ii, g := range r.instances {
			rng := rand.New(rand.NewPCG(uint64(ri), uint64(ii)+7))
			wg.Go(func() {
				for {
					select {
					case <-stop:
						return
					case <-time.After(time.Duration(1+rng.IntN(20)) * time.Millisecond):
					}
					n := uint64(50 + rng.IntN(750))
					if _, err := g.Evaluate(context.Background(), []limit.Check{budgetCheck(key, lim, n, limit.ByHits)}); err == nil {
						charged.Add(n)
					}
				}
			})
		}
	}
	cuts(w, 13, 8, func(rng *rand.Rand) time.Duration { return time.Duration(200+rng.IntN(300)) * time.Millisecond })
	time.Sleep(300 * time.Millisecond)
	close(stop)
	wg.Wait()
	w.close()
	got, x := homeCount(t, w, key), charged.Load()+lim
	retried := testutil.ToFloat64(m.Grants.WithLabelValues("failed"))
	t.Logf("the home counts %d, %d charged and %d spent before; %.0f calls to it failed", got, x-lim, uint64(lim), retried)
	if got != x {
		t.Errorf("the home counts %d; want %d: %d", got, x, int64(got)-int64(x))
	}
	if retried == 0 {
		t.Error("no call to the home failed: the cuts tested nothing")
	}
}

// TestBudgetPartitionShare: a region cut off from the home before it
// held anything, with the share policy: its budget checks are decided on
// its share of the budget in its own Redis, which its charges spend;
// once spent there, refused. After the heal the home has every token
// charged meanwhile, and the region draws from it again.
func TestBudgetPartitionShare(t *testing.T) {
	clock := hourClock()
	m := global.NewMetrics(prometheus.NewRegistry())
	w := newWorldWith(t, 1, 1, func(int) time.Duration { return 10 * time.Millisecond }, 0,
		global.Options{Refresh: 50 * time.Millisecond, HomeTimeout: 100 * time.Millisecond, OutAfter: 200 * time.Millisecond,
			Policy: global.Share, Share: 0.2, Metrics: m, Now: clock},
		func(o *redisstore.Options) { o.Timeout, o.ScriptTime = 100*time.Millisecond, clock })
	g := w.regions[0].instances[0]
	const key, lim = "g:shared", 1000
	decide := func(c limit.Check) limit.Result {
		t.Helper()
		res, err := g.Evaluate(context.Background(), []limit.Check{c})
		if err != nil {
			t.Fatal(err)
		}
		return res[0]
	}
	w.regions[0].wan.Partition()
	deadline := time.Now().Add(5 * time.Second)
	for testutil.ToFloat64(m.Requests.WithLabelValues("shared")) == 0 {
		decide(budgetCheck(key, lim, 0, limit.ByHits))
		if time.Now().After(deadline) {
			t.Fatal("the home never counted as out")
		}
		time.Sleep(20 * time.Millisecond)
	}
	steps := []struct {
		c    limit.Check
		over bool
		what string
	}{
		{budgetCheck(key, lim, 0, limit.ByHits), false, "a check on the unspent share"},
		{budgetCheck(key, lim, 150, limit.ByHits), false, "a charge of 150 of the share of 200"},
		{budgetCheck(key, lim, 0, limit.ByHits), false, "a check with 50 of the share left"},
		{budgetCheck(key, lim, 100, limit.ByHits), true, "a charge of 100 with 50 left"},
		{budgetCheck(key, lim, 0, limit.ByHits), true, "a check on the spent share"},
	}
	for _, st := range steps {
		if r := decide(st.c); r.Over != st.over {
			t.Errorf("%s: %+v, want over %v", st.what, r, st.over)
		}
	}
	w.regions[0].wan.Heal()
	eventually := func(what string, ok func() bool) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for !ok() {
			if time.Now().After(deadline) {
				t.Fatalf("not within 10 s: %s", what)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	eventually("the 250 tokens charged while cut off settled at the home", func() bool {
		raw, err := w.home.Client().Get(context.Background(), key).Result()
		_, count, _ := strings.Cut(raw, ":")
		n, _ := strconv.ParseUint(count, 10, 64)
		return err == nil && n >= 250
	})
	eventually("a check admitted from the home again", func() bool { return !decide(budgetCheck(key, lim, 0, limit.ByHits)).Over })
	w.close()
	// Exactly the charges, but for hits drawn that the home may have
	// counted without this store knowing: a draw unanswered within the
	// home's timeout, or a give-back at close unanswered (0 on a quiet
	// machine; a busy one may pass the 100 ms timeout).
	unsure := uint64(testutil.ToFloat64(m.Hits.WithLabelValues("unanswered")) + testutil.ToFloat64(m.Hits.WithLabelValues("lost")))
	if n := homeCount(t, w, key); n < 250 || n > 250+unsure {
		t.Errorf("the home counts %d; want the 250 charged (and at most %d drawn but unanswered)", n, unsure)
	}
}

// TestGlobalBudgetHoldsFlights: once a charge has taught what a stream
// spends (500 of a budget of 5,000), each admitted check holds that much
// of the grants while its stream runs, and grants add up to at most the
// budget: over two instances, checks whose streams have not ended are
// admitted only while the budget covers them (8, after 1,000 charged,
// and one an instance with none in flight), and when they all charge,
// the spend stays within the budget and a stream.
func TestGlobalBudgetHoldsFlights(t *testing.T) {
	clock := hourClock()
	w := newWorldWith(t, 1, 2, func(int) time.Duration { return 5 * time.Millisecond }, 0,
		global.Options{Refresh: 20 * time.Millisecond, Now: clock}, func(o *redisstore.Options) { o.ScriptTime = clock })
	gs := w.regions[0].instances
	const key, lim, spend = "g:flights", 5000, 500
	decide := func(g *global.Store, c limit.Check) limit.Result {
		t.Helper()
		res, err := g.Evaluate(context.Background(), []limit.Check{c})
		if err != nil {
			t.Fatal(err)
		}
		return res[0]
	}
	for _, g := range gs {
		decide(g, budgetCheck(key, lim, 0, limit.ByHits))
		decide(g, budgetCheck(key, lim, spend, limit.ByHits))
	}
	admitted := 0
	for i := 0; i < 200; i++ {
		if !decide(gs[i%2], budgetCheck(key, lim, 0, limit.ByHits)).Over {
			admitted++
		}
		time.Sleep(10 * time.Millisecond) // draws land meanwhile
	}
	// Each instance may admit one stream beyond what it holds whole: the
	// budget's last, with none of its own in flight.
	if admitted > (lim-2*spend)/spend+len(gs) || admitted == 0 {
		t.Errorf("%d streams admitted in flight at once; want some, at most the %d the budget's %d left covers and one an instance", admitted, (lim-2*spend)/spend, lim-2*spend)
	}
	for i := range admitted {
		decide(gs[i%2], budgetCheck(key, lim, spend, limit.ByHits))
	}
	// Streams one after another: each charge ends its check's flight and
	// pays from its hold, so the budget serves them all (9 of 500 with
	// 500 charged before).
	const next = "g:flights2"
	decide(gs[0], budgetCheck(next, lim, 0, limit.ByHits))
	decide(gs[0], budgetCheck(next, lim, spend, limit.ByHits))
	for i := range 8 {
		deadline := time.Now().Add(2 * time.Second)
		for decide(gs[0], budgetCheck(next, lim, 0, limit.ByHits)).Over {
			if time.Now().After(deadline) {
				t.Fatalf("stream %d of 500 refused with %d of the budget charged", i+2, (i+1)*spend)
			}
			time.Sleep(10 * time.Millisecond)
		}
		decide(gs[0], budgetCheck(next, lim, spend, limit.ByHits))
	}
	// Envoy AI Gateway's request phase states no hits: it costs 1, and on
	// a budget this instance has seen charged it holds the estimate too.
	const phase = "g:flights3"
	decide(gs[0], budgetCheck(phase, lim, 0, limit.ByHits))
	decide(gs[0], budgetCheck(phase, lim, spend, limit.ByHits))
	costly := 0
	for range 200 {
		if !decide(gs[0], budgetCheck(phase, lim, 1, limit.CostCheck)).Over {
			costly++
		}
		time.Sleep(5 * time.Millisecond)
	}
	if costly > (lim-spend)/(spend+1)+1 || costly == 0 {
		t.Errorf("%d request phases admitted in flight at once; want some, at most the %d the budget's %d left covers", costly, (lim-spend)/(spend+1), lim-spend)
	}
	w.close()
	if n := homeCount(t, w, key); n != uint64(2+admitted)*spend || n > lim+uint64(len(gs))*spend {
		t.Errorf("the home counts %d; want the %d charged, within the budget %d and a stream an instance", n, (2+admitted)*spend, lim)
	}
	if n := homeCount(t, w, next); n != 9*spend {
		t.Errorf("the home counts %d of the streams one after another; want the %d charged", n, 9*spend)
	}
}

// TestGlobalBudgetSpentElsewhere: an instance that has seen no charge of
// a budget (its streams' ends went elsewhere) and holds none of it
// refuses its checks once the home, read every refresh, says another
// region spent it all.
func TestGlobalBudgetSpentElsewhere(t *testing.T) {
	clock := hourClock()
	w := newWorldWith(t, 2, 1, func(int) time.Duration { return 5 * time.Millisecond }, 0,
		global.Options{Refresh: 20 * time.Millisecond, Now: clock}, func(o *redisstore.Options) { o.ScriptTime = clock })
	a, b := w.regions[0].instances[0], w.regions[1].instances[0]
	const key, lim = "g:elsewhere", 1000
	ctx := context.Background()
	if _, err := a.Evaluate(ctx, []limit.Check{budgetCheck(key, lim, lim, limit.ByHits)}); err != nil {
		t.Fatal(err)
	}
	// Settled at the home before b first asks: b never holds any of it
	// (held, a hit would be the budget's unspent last, and admit checks
	// as a region's budget with a hit left does).
	deadline := time.Now().Add(5 * time.Second)
	for w.home.Client().Exists(ctx, key).Val() == 0 || homeCount(t, w, key) < lim {
		if time.Now().After(deadline) {
			t.Fatal("the charge never settled at the home")
		}
		time.Sleep(10 * time.Millisecond)
	}
	for i := range 20 {
		res, err := b.Evaluate(ctx, []limit.Check{budgetCheck(key, lim, 0, limit.ByHits)})
		if err != nil {
			t.Fatal(err)
		}
		if !res[0].Over {
			t.Fatalf("check %d on a budget spent in another region: admitted (%+v), want refused", i+1, res[0])
		}
	}
}
