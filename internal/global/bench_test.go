package global_test

import (
	"flag"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/internal/global"
	"github.com/ratelimitd/ratelimitd/internal/limit"
)

var (
	benchWindow  = flag.Duration("regions.window", 10*time.Second, "BenchmarkRegions: the limit's window")
	benchWindows = flag.Int("regions.windows", 3, "BenchmarkRegions: windows measured per scenario, after one of warm-up")
	benchLimit   = flag.Uint64("regions.limit", 1000, "BenchmarkRegions: the limit a window")
	benchPart    = flag.Duration("regions.partition", 30*time.Second, "BenchmarkRegions: how long a region is cut off")
)

// windowStats reads a tally's windows from `from` on: the most and least
// admitted (of the limit), the share of requests refused, and the share
// refused falsely: refusals a window could have admitted, as it ended
// under its limit (a refusal in a window that admitted its limit is the
// limit's).
func windowStats(tl *tally, from int64, lim uint64) (most, least, refused, falsely float64, n int) {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	least = 1e9
	var asked, admitted, false_ uint64
	for w, a := range tl.asked {
		if w < from || w == tl.last() {
			continue // warm-up, or the window the run stopped in
		}
		n++
		ad := tl.admitted[w]
		asked += a
		admitted += ad
		false_ += min(a-ad, lim-min(ad, lim))
		most = max(most, float64(ad)/float64(lim))
		least = min(least, float64(ad)/float64(lim))
	}
	if asked > 0 {
		refused = 1 - float64(admitted)/float64(asked)
		falsely = float64(false_) / float64(asked)
	}
	return most, least, refused, falsely, n
}

// last is the latest window a tally saw. Called with mu held.
func (t *tally) last() int64 {
	var l int64
	for w := range t.asked {
		l = max(l, w)
	}
	return l
}

func p99(ds []time.Duration) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)*99/100]
}

// BenchmarkRegions is the scenario of docs/regions.md's figures: three
// regions of two instances, 150 ms round trips to the home (10 ms
// jitter), one global limit. It reports, per offered load and skew, the
// most and least admitted in a window (of the limit) and the share of
// requests refused; the local decision's p99 beside a regional Redis
// call's; a region cut off for -regions.partition under each policy; the
// home restarted empty. One run: go test -run XXX -bench Regions
// -benchtime 1x ./internal/global/ (about seven minutes).
func BenchmarkRegions(b *testing.B) {
	for range b.N {
		runRegions(b)
	}
}

func runRegions(b *testing.B) {
	win, lim := *benchWindow, *benchLimit
	rate := float64(lim) / win.Seconds()
	even, skew := []float64{1. / 3, 1. / 3, 1. / 3}, []float64{0.9, 0.05, 0.05}
	fmt.Printf("| offered | demand | windows | most admitted | least admitted | refused | refused falsely |\n| --- | --- | --- | --- | --- | --- | --- |\n")
	for _, sc := range []struct {
		mult  float64
		share []float64
		name  string
	}{{0.5, even, "even"}, {0.5, skew, "90 % in one region"}, {1, even, "even"}, {1, skew, "90 % in one region"}, {3, even, "even"}, {3, skew, "90 % in one region"}} {
		w := newBenchWorld(b, global.Options{})
		c := limit.Check{Key: fmt.Sprintf("bench:%v:%s", sc.mult, sc.name), Limit: lim, WindowUS: win.Microseconds(), Hits: 1, Global: true}
		tl := newTally(win.Microseconds(), 3)
		tl.keepLat = sc.mult == 1 && sc.name == "even"
		stop := make(chan struct{})
		from := time.Now().Add(win).UnixMicro() / win.Microseconds()
		wg := drive(w, c, sc.mult*rate, sc.share, tl, stop)
		time.Sleep(time.Duration(*benchWindows+1)*win + win/2)
		close(stop)
		wg.Wait()
		most, least, refused, falsely, n := windowStats(tl, from, lim)
		fmt.Printf("| %v× | %s | %d | %.3f | %.3f | %.1f %% | %.1f %% |\n", sc.mult, sc.name, n, most, least, 100*refused, 100*falsely)
		if tl.keepLat {
			local := p99(tl.lat)
			// The same traffic on the region's own Redis, the check not
			// global: what a decision costs without the feature.
			plain := c
			plain.Global, plain.Key = false, c.Key+":plain"
			tp := newTally(win.Microseconds(), 3)
			tp.keepLat = true
			stop := make(chan struct{})
			wg := drive(w, plain, rate, even, tp, stop)
			time.Sleep(3 * time.Second)
			close(stop)
			wg.Wait()
			// A decision from what is held takes microseconds; one that
			// waited for a draw, a round trip.
			var warm []time.Duration
			for _, d := range tl.lat {
				if d < 20*time.Millisecond {
					warm = append(warm, d)
				}
			}
			fmt.Printf("\ndecision p99: global %v (%.1f %% waited for a draw; from what was held: p99 %v), the same check in the region's Redis %v (%d and %d decisions)\n\n",
				local, 100*float64(len(tl.lat)-len(warm))/float64(max(len(tl.lat), 1)), p99(warm), p99(tp.lat), len(tl.lat), len(tp.lat))
		}
		w.close()
	}
	for _, pol := range []global.Options{{}, {Policy: global.Share, Share: 0.2}} {
		w := newBenchWorld(b, pol)
		c := limit.Check{Key: fmt.Sprintf("bench:part:%d", pol.Policy), Limit: lim, WindowUS: win.Microseconds(), Hits: 1, Global: true}
		tl := newTally(win.Microseconds(), 3)
		stop := make(chan struct{})
		wg := drive(w, c, rate, even, tl, stop)
		time.Sleep(win)
		cutAt := time.Now()
		w.regions[0].wan.Partition()
		time.Sleep(*benchPart)
		w.regions[0].wan.Heal()
		healAt := time.Now()
		time.Sleep(2 * win)
		close(stop)
		wg.Wait()
		tl.mu.Lock()
		var during, after []string
		for wi := cutAt.UnixMicro() / win.Microseconds(); wi <= tl.last(); wi++ {
			cell := fmt.Sprintf("%d %v", tl.admitted[wi], tl.byRegion[wi])
			if time.UnixMicro(wi * win.Microseconds()).Before(healAt) {
				during = append(during, cell)
			} else {
				after = append(after, cell)
			}
		}
		tl.mu.Unlock()
		fmt.Printf("partition of region 0 for %v, policy %d (share %v), 1× even, limit %d: admitted by window (by region) while cut %v; after the heal %v\n",
			*benchPart, pol.Policy, pol.Share, lim, during, after)
		w.close()
	}
	w := newBenchWorld(b, global.Options{})
	c := limit.Check{Key: "bench:restart", Limit: lim, WindowUS: win.Microseconds(), Hits: 1, Global: true}
	tl := newTally(win.Microseconds(), 3)
	stop := make(chan struct{})
	wg := drive(w, c, 3*rate, even, tl, stop)
	time.Sleep(win + win/2)
	restartAt := time.Now()
	w.home.Restart()
	time.Sleep(2 * win)
	close(stop)
	wg.Wait()
	tl.mu.Lock()
	var cells []string
	for wi := restartAt.UnixMicro()/win.Microseconds() - 1; wi <= tl.last(); wi++ {
		cells = append(cells, fmt.Sprint(tl.admitted[wi]))
	}
	tl.mu.Unlock()
	fmt.Printf("home restarted empty mid-window, 3× even, limit %d: admitted by window from the one before %v\n", lim, cells)
	w.close()
}
