package global_test

import (
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/ratelimitd/ratelimitd/internal/global"
	"github.com/ratelimitd/ratelimitd/internal/limit"
	"github.com/ratelimitd/ratelimitd/internal/redisstore"
)

var (
	budgetModes = flag.String("budget.modes", "global,one Redis for the world,one per region",
		"BenchmarkGlobalBudget: the budgets compared, comma-separated")
	budgetOffered = flag.String("budget.offered", "1,3", "BenchmarkGlobalBudget: the spends offered, in budgets a window, comma-separated")
)

// BenchmarkGlobalBudget: a token budget spent by streams in three regions
// of two instances, 150 ms from the home: each stream a check, then
// 0.2-2 s later a charge of 100-1,900 tokens. Per offered spend (of the
// budget a window), the most and least spent in a window, of the budget,
// and the streams refused: with the budget global; with one Redis for
// the world (every call 150 ms away: the spend's ideal); and with a
// budget per region (each region's own Redis, as without the feature).
// One run: go test -run XXX -bench GlobalBudget -benchtime 1x
// ./internal/global/ (about five minutes); -args -budget.modes=global
// -regions.windows=8 for the global budget alone over more windows.
func BenchmarkGlobalBudget(b *testing.B) {
	for range b.N {
		win, budget := *benchWindow, *benchLimit*200
		fmt.Printf("| offered | budget | windows | most spent | least spent | streams refused |\n| --- | --- | --- | --- | --- | --- |\n")
		for o := range strings.SplitSeq(*budgetOffered, ",") {
			mult, err := strconv.ParseFloat(o, 64)
			if err != nil {
				b.Fatalf("-budget.offered: %v", err)
			}
			for mode := range strings.SplitSeq(*budgetModes, ",") {
				if !slices.Contains([]string{"global", "one Redis for the world", "one per region"}, mode) {
					b.Fatalf("-budget.modes: unknown %q", mode)
				}
				m := global.NewMetrics(prometheus.NewRegistry())
				w := newBenchWorld(b, global.Options{Metrics: m})
				glob := mode == "global"
				c := limit.Check{Key: fmt.Sprintf("budget:%v:%v", mult, mode), Limit: budget, WindowUS: win.Microseconds(), Global: glob, Usage: true, FlightS: 300}
				// Streams a second over all instances: mult budgets a
				// window at 1,000 tokens a stream.
				rate := mult * float64(budget) / 1000 / win.Seconds()
				sp := newSpend(win)
				from := time.Now().Add(win).UnixMicro() / win.Microseconds()
				stop := make(chan struct{})
				var wg sync.WaitGroup
				for ri, r := range w.regions {
					for ii, g := range r.instances {
						var st evaluator = g
						if mode == "one Redis for the world" {
							home, err := redisstore.New(redisstore.Options{URL: r.wan.URL(), Timeout: time.Second})
							if err != nil {
								b.Fatal(err)
							}
							defer home.Close()
							st = home
						}
						wg.Go(func() { streams(st, c, rate/6, rand.New(rand.NewPCG(uint64(ri), uint64(ii))), sp, stop) })
					}
				}
				time.Sleep(time.Duration(*benchWindows+1)*win + win/2)
				close(stop)
				wg.Wait()
				most, least, refused, n := sp.stats(from, budget)
				fmt.Printf("| %v× | %s | %d | %.3f | %.3f | %.1f %% |\n", mult, mode, n, most, least, 100*refused)
				if glob && testing.Verbose() {
					for _, what := range []string{"granted", "given_back", "lost", "charged", "settled", "expired", "unanswered"} {
						fmt.Printf("hits %s: %.0f\n", what, testutil.ToFloat64(m.Hits.WithLabelValues(what)))
					}
				}
				w.close()
			}
		}
	}
}

// evaluator decides checks: a global store, or a Redis store.
type evaluator interface {
	Evaluate(ctx context.Context, checks []limit.Check) ([]limit.Result, error)
}

// spend counts tokens charged and streams admitted or refused per window.
type spend struct {
	mu              sync.Mutex
	winUS           int64
	tokens          map[int64]uint64
	asked, refusals map[int64]int
}

func newSpend(win time.Duration) *spend {
	return &spend{winUS: win.Microseconds(), tokens: map[int64]uint64{}, asked: map[int64]int{}, refusals: map[int64]int{}}
}

func (s *spend) add(at time.Time, tokens uint64, check, refused bool) {
	w := at.UnixMicro() / s.winUS
	s.mu.Lock()
	defer s.mu.Unlock()
	s.tokens[w] += tokens
	if check {
		s.asked[w]++
	}
	if refused {
		s.refusals[w]++
	}
}

// stats are the most and least spent in a window from `from` on (of the
// budget; the window the run stopped in left out) and the share of
// streams refused.
func (s *spend) stats(from int64, budget uint64) (most, least, refused float64, n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var last int64
	for w := range s.asked {
		last = max(last, w)
	}
	least = 1e9
	asked, ref := 0, 0
	for w := from; w < last; w++ {
		n++
		f := float64(s.tokens[w]) / float64(budget)
		if testing.Verbose() {
			fmt.Printf("window %d: %.3f of the budget spent, %d of %d streams refused\n", w-from, f, s.refusals[w], s.asked[w])
		}
		most, least = max(most, f), min(least, f)
		asked += s.asked[w]
		ref += s.refusals[w]
	}
	if asked > 0 {
		refused = float64(ref) / float64(asked)
	}
	return most, least, refused, n
}

// streams starts streams on g at per a second until stop, each on its
// own (a check that waits on a far Redis does not hold the next back): a
// check, and if admitted a charge 0.2-2 s later. A charge counts in the
// window it is made in.
func streams(g evaluator, c limit.Check, per float64, rng *rand.Rand, sp *spend, stop <-chan struct{}) {
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		select {
		case <-stop:
			return
		case <-time.After(time.Duration(rng.ExpFloat64() / per * float64(time.Second))):
		}
		took, n := time.Duration(200+rng.IntN(1800))*time.Millisecond, uint64(100+rng.IntN(1800))
		wg.Go(func() {
			check := c
			check.Hits, check.Kind = 0, limit.ByHits
			res, err := g.Evaluate(context.Background(), []limit.Check{check})
			refused := err != nil || res[0].Over
			sp.add(time.Now(), 0, true, refused)
			if refused {
				return
			}
			time.Sleep(took)
			charge := c
			charge.Hits, charge.Kind = n, limit.ByHits
			if _, err := g.Evaluate(context.Background(), []limit.Check{charge}); err == nil {
				sp.add(time.Now(), n, false, false)
			}
		})
	}
}
