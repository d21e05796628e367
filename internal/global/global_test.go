package global_test

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/internal/global"
	"github.com/ratelimitd/ratelimitd/internal/limit"
	"github.com/ratelimitd/ratelimitd/internal/redisstore"
	"github.com/ratelimitd/ratelimitd/internal/redisstore/redistest"
)

// world is a home Redis and regions, each with its own Redis, a WAN to
// the home and instances drawing global limits through it.
type world struct {
	home    *redistest.Server
	regions []*region
}

type region struct {
	local     *redisstore.Store
	wan       *redistest.WAN
	instances []*global.Store
}

// newWorld starts a home and n regions of k instances, each region's
// WAN with the round trip rtt(i) and jitter.
func newWorld(t testing.TB, n, k int, rtt func(i int) time.Duration, jitter time.Duration, opts global.Options) *world {
	t.Helper()
	return newWorldWith(t, n, k, rtt, jitter, opts, nil)
}

// newWorldWith is newWorld, each instance's home store's options edited
// by homeEdit when it is set.
func newWorldWith(t testing.TB, n, k int, rtt func(i int) time.Duration, jitter time.Duration, opts global.Options, homeEdit func(*redisstore.Options)) *world {
	t.Helper()
	w := &world{home: redistest.Start(t)}
	for i := range n {
		r := &region{wan: redistest.NewWAN(t, w.home.Addr(), rtt(i), jitter)}
		var err error
		r.local, err = redisstore.New(redisstore.Options{URL: redistest.Start(t).URL(), Timeout: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { r.local.Close() })
		for range k {
			hopts := redisstore.Options{URL: r.wan.URL(), Timeout: time.Second, BreakerOpenAfter: time.Hour}
			if homeEdit != nil {
				homeEdit(&hopts)
			}
			home, err := redisstore.New(hopts)
			if err != nil {
				t.Fatal(err)
			}
			g := global.New(r.local, home, opts)
			t.Cleanup(func() { g.Close(); home.Close() })
			r.instances = append(r.instances, g)
		}
		w.regions = append(w.regions, r)
	}
	return w
}

// close stops every instance's refiller (the Redis servers stop with the
// test).
func (w *world) close() {
	for _, r := range w.regions {
		for _, g := range r.instances {
			g.Close()
		}
	}
}

// newBenchWorld is the scenario of the issue: three regions of two
// instances, 150 ms round trips to the home with 10 ms of jitter.
func newBenchWorld(tb testing.TB, opts global.Options) *world {
	return newWorld(tb, 3, 2, func(int) time.Duration { return 150 * time.Millisecond }, 10*time.Millisecond, opts)
}

// tally counts admissions per window, on the machine's clock, which is
// the home Redis's.
type tally struct {
	mu       sync.Mutex
	windowUS int64
	admitted map[int64]uint64
	byRegion map[int64][]uint64
	asked    map[int64]uint64
	n        int
	lat      []time.Duration // each decision's time, when kept
	keepLat  bool
}

func newTally(windowUS int64, regions int) *tally {
	return &tally{windowUS: windowUS, admitted: map[int64]uint64{}, byRegion: map[int64][]uint64{}, asked: map[int64]uint64{}, n: regions}
}

func (t *tally) add(at time.Time, region int, ok bool, took time.Duration) {
	w := at.UnixMicro() / t.windowUS
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.keepLat {
		t.lat = append(t.lat, took)
	}
	t.asked[w]++
	if !ok {
		return
	}
	t.admitted[w]++
	if t.byRegion[w] == nil {
		t.byRegion[w] = make([]uint64, t.n)
	}
	t.byRegion[w][region]++
}

// drive offers rate requests a second over all instances, split between
// regions by share, until stop, each a check of c.
func drive(w *world, c limit.Check, rate float64, share []float64, tl *tally, stop <-chan struct{}) *sync.WaitGroup {
	var wg sync.WaitGroup
	for ri, r := range w.regions {
		per := rate * share[ri] / float64(len(r.instances))
		if per <= 0 {
			continue
		}
		for ii, g := range r.instances {
			driveOne(&wg, g, ri, uint64(ii), c, per, tl, stop)
		}
	}
	return &wg
}

// driveOne offers per requests a second to g, of region ri, until stop.
func driveOne(wg *sync.WaitGroup, g *global.Store, ri int, seed uint64, c limit.Check, per float64, tl *tally, stop <-chan struct{}) {
	wg.Go(func() {
		rng := rand.New(rand.NewPCG(uint64(ri), seed))
		for {
			select {
			case <-stop:
				return
			case <-time.After(time.Duration(rng.ExpFloat64() / per * float64(time.Second))):
			}
			start := time.Now()
			var at time.Time
			res, err := g.Evaluate(global.WithDecidedAt(context.Background(), &at), []limit.Check{c})
			// An admission counts in the window it was decided in, by
			// the store's clock: the machine's, which is the home
			// Redis's too.
			tl.add(at, ri, err == nil && !res[0].Over, time.Since(start))
		}
	})
}

// TestNeverOverAcrossRegions: three regions of two instances, round trips
// to the home of 20-150 ms with jitter, offered 0.5x, 1x and 3x the limit,
// evenly and 90 % from one region, while regions are cut off from the
// home at random and healed: in no window do all regions together admit
// more than the limit (the partition policy is deny). At 3x, grants flow:
// some window admits at least half the limit (the benchmark measures how
// much; a busy machine slows the draws).
func TestNeverOverAcrossRegions(t *testing.T) {
	const windowUS, lim = 1_000_000, 100
	w := newWorld(t, 3, 2, func(i int) time.Duration { return time.Duration(20+65*i) * time.Millisecond }, 20*time.Millisecond,
		global.Options{Refresh: 100 * time.Millisecond, HomeTimeout: 500 * time.Millisecond})
	for _, tc := range []struct {
		mult  float64
		share []float64
	}{
		{0.5, []float64{1. / 3, 1. / 3, 1. / 3}},
		{1, []float64{0.9, 0.05, 0.05}},
		{3, []float64{1. / 3, 1. / 3, 1. / 3}},
		{3, []float64{0.05, 0.9, 0.05}},
	} {
		name := fmt.Sprintf("%vx_%v", tc.mult, tc.share[1] > 0.5)
		t.Run(name, func(t *testing.T) {
			c := limit.Check{Key: "g:" + name, Limit: lim, WindowUS: windowUS, Hits: 1, Global: true}
			tl := newTally(windowUS, 3)
			stop := make(chan struct{})
			wg := drive(w, c, tc.mult*lim, tc.share, tl, stop)
			// Cuts: a region at random is partitioned for 0.2-1 s, twice.
			rng := rand.New(rand.NewPCG(7, uint64(tc.mult*10)))
			for range 2 {
				time.Sleep(time.Duration(300+rng.IntN(700)) * time.Millisecond)
				r := w.regions[rng.IntN(3)]
				r.wan.Partition()
				time.Sleep(time.Duration(200+rng.IntN(800)) * time.Millisecond)
				r.wan.Heal()
			}
			time.Sleep(time.Second)
			close(stop)
			wg.Wait()
			tl.mu.Lock()
			defer tl.mu.Unlock()
			over, best := 0, uint64(0)
			for win, n := range tl.admitted {
				if n > lim {
					over++
					t.Errorf("window %d: %d admitted over all regions (by region %v), over the limit %d", win, n, tl.byRegion[win], lim)
				}
				best = max(best, n)
			}
			t.Logf("%d windows, the most admitted in one %d of %d; admitted %v, asked %v", len(tl.admitted), best, lim, tl.admitted, tl.asked)
			if tc.mult >= 3 && best < lim/2 {
				t.Errorf("at %vx offered, no window admitted even half the limit (best %d): grants do not flow", tc.mult, best)
			}
		})
	}
}

// TestNeverOverJoiningAndLeaving: at 3x the limit, an instance leaves
// (its driver stops, it closes and gives back what it held) and another
// joins another region mid-window: no window admits more than the limit.
func TestNeverOverJoiningAndLeaving(t *testing.T) {
	const windowUS, lim = 1_000_000, 100
	opts := global.Options{Refresh: 100 * time.Millisecond, HomeTimeout: 500 * time.Millisecond}
	w := newWorld(t, 3, 2, func(i int) time.Duration { return time.Duration(30+40*i) * time.Millisecond }, 10*time.Millisecond, opts)
	c := limit.Check{Key: "g:join", Limit: lim, WindowUS: windowUS, Hits: 1, Global: true}
	tl := newTally(windowUS, 3)
	stop := make(chan struct{})
	wg := drive(w, c, 2*lim, []float64{0.5, 0.25, 0.25}, tl, stop)
	leaving, stopLeaving := w.regions[0].instances[0], make(chan struct{})
	var lwg sync.WaitGroup
	driveOne(&lwg, leaving, 0, 99, c, lim, tl, stopLeaving)
	time.Sleep(1700 * time.Millisecond)
	close(stopLeaving)
	lwg.Wait()
	leaving.Close()
	home, err := redisstore.New(redisstore.Options{URL: w.regions[2].wan.URL(), Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	joining := global.New(w.regions[2].local, home, opts)
	t.Cleanup(func() { joining.Close(); home.Close() })
	driveOne(wg, joining, 2, 98, c, lim, tl, stop)
	time.Sleep(2 * time.Second)
	close(stop)
	wg.Wait()
	tl.mu.Lock()
	defer tl.mu.Unlock()
	for win, n := range tl.admitted {
		if n > lim {
			t.Errorf("window %d: %d admitted (by region %v), over the limit %d", win, n, tl.byRegion[win], lim)
		}
	}
	t.Logf("admitted by window and region: %v", tl.byRegion)
}

// TestRefusalConsumesNothing: a request whose global check cannot be
// covered (it asks more than the limit: the draw made while it waits
// falls short) is refused whole: its other counter, in the region's
// store, is read, not consumed.
func TestRefusalConsumesNothing(t *testing.T) {
	w := newWorld(t, 1, 1, func(int) time.Duration { return 10 * time.Millisecond }, 0,
		global.Options{Refresh: time.Hour}) // no top-up but the draw a request waits for
	g := w.regions[0].instances[0]
	checks := []limit.Check{
		{Key: "plain", Limit: 10, WindowUS: 3600e6, Hits: 1},
		{Key: "glob", Limit: 10, WindowUS: 3600e6, Hits: 11, Global: true},
	}
	res, err := g.Evaluate(context.Background(), checks)
	if err != nil {
		t.Fatal(err)
	}
	if !res[1].Over {
		t.Fatalf("a global check of 11 on a limit of 10: %+v, want refused", res[1])
	}
	read, err := w.regions[0].local.Evaluate(context.Background(), []limit.Check{{Key: "plain", Limit: 10, WindowUS: 3600e6}})
	if err != nil {
		t.Fatal(err)
	}
	if read[0].Remaining != 10 {
		t.Errorf("the plain counter of a refused request has %d left, want 10: consumed", read[0].Remaining)
	}
}

// TestPartitionShare: with the share policy, a region cut off from the
// home spends what it holds, then admits up to its share of the limit a
// window in its own store; the other regions keep drawing from the home;
// no window admits more than the limit and the share, nor a window in
// which no instance held the home out (on a crowded machine calls to the
// home can fail for --global-out-after with no cut: the share answers
// then too) more than the limit.
func TestPartitionShare(t *testing.T) {
	const windowUS, lim, share = 1_000_000, 100, 0.2
	back := &backLog{}
	w := newWorld(t, 2, 2, func(int) time.Duration { return 40 * time.Millisecond }, 10*time.Millisecond,
		global.Options{Refresh: 100 * time.Millisecond, HomeTimeout: 300 * time.Millisecond, OutAfter: 300 * time.Millisecond, Policy: global.Share, Share: share,
			Logger: slog.New(back)})
	c := limit.Check{Key: "g:share", Limit: lim, WindowUS: windowUS, Hits: 1, Global: true}
	tl := newTally(windowUS, 2)
	stop := make(chan struct{})
	wg := drive(w, c, 3*lim, []float64{0.5, 0.5}, tl, stop)
	time.Sleep(1500 * time.Millisecond)
	w.regions[0].wan.Partition()
	partedAt := time.Now()
	time.Sleep(3 * time.Second)
	w.regions[0].wan.Heal()
	time.Sleep(1500 * time.Millisecond)
	close(stop)
	wg.Wait()
	// The share answers until an instance hears from the home again,
	// which on a busy machine may be well after the heal.
	healedAt := back.last()
	tl.mu.Lock()
	defer tl.mu.Unlock()
	var sharedWindows atomic.Int64
	for win, n := range tl.admitted {
		bound := uint64(lim)
		start := time.UnixMicro(win * windowUS)
		end := start.Add(time.Duration(windowUS) * time.Microsecond)
		parted := !end.Before(partedAt) && !start.After(healedAt) || back.heldOut(start, end)
		if parted {
			// The share is counted by the region's Redis, on its own
			// clock, a moment after the store's decision time this
			// tally counts by: a share decision made as a window ends
			// may count in the next there. Each instance has one
			// request in flight at a time: at most one such a window.
			bound += uint64(lim*share) + uint64(len(w.regions[0].instances))
		}
		if n > bound {
			t.Errorf("window %d (partitioned: %v): %d admitted (by region %v), over %d", win, parted, n, tl.byRegion[win], bound)
		}
		// A window wholly inside the partition, after the home counted
		// as out: region 0 admits from its share.
		if start.After(partedAt.Add(time.Second)) && start.Add(time.Second).Before(healedAt) {
			if by := tl.byRegion[win]; by != nil && by[0] > 0 {
				sharedWindows.Add(1)
			}
		}
	}
	t.Logf("admitted by window and region: %v", tl.byRegion)
	if sharedWindows.Load() == 0 {
		t.Errorf("the partitioned region admitted nothing in the partition's whole windows: its share unused (%v)", tl.byRegion)
	}
}

// backLog is a log handler that keeps when the last instance said the
// home answers again.
type backLog struct {
	mu sync.Mutex
	at time.Time
	// out counts the instances that hold the home out; spans are when
	// at least one did (the last one open while out > 0).
	out   int
	spans [][2]time.Time
}

func (b *backLog) Enabled(context.Context, slog.Level) bool { return true }
func (b *backLog) WithAttrs([]slog.Attr) slog.Handler       { return b }
func (b *backLog) WithGroup(string) slog.Handler            { return b }

func (b *backLog) Handle(_ context.Context, r slog.Record) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	switch {
	case strings.Contains(r.Message, "answers again"):
		b.at = time.Now()
		if b.out--; b.out == 0 && len(b.spans) > 0 {
			b.spans[len(b.spans)-1][1] = b.at
		}
	case strings.Contains(r.Message, "cannot be reached"):
		if b.out++; b.out == 1 {
			b.spans = append(b.spans, [2]time.Time{time.Now()})
		}
	}
	return nil
}

// heldOut reports whether some instance held the home out (and so let
// the partition policy answer) at a moment of [from, to): on a crowded
// machine calls to the home can fail for --global-out-after with no cut.
func (b *backLog) heldOut(from, to time.Time) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, sp := range b.spans {
		if sp[0].Before(to) && (sp[1].IsZero() || !sp[1].Before(from)) {
			return true
		}
	}
	return false
}

// last is when the home was last heard again; the zero time if never.
func (b *backLog) last() time.Time {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.at
}
