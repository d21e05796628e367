package global_test

import (
	"context"
	"flag"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/ratelimitd/ratelimitd/internal/global"
	"github.com/ratelimitd/ratelimitd/internal/limit"
)

var (
	benchKeys    = flag.Int("keys.count", 1_000_000, "BenchmarkDistinctKeys: distinct keys, each asked once")
	benchCallers = flag.Int("keys.callers", 2000, "BenchmarkDistinctKeys: callers asking at once")
)

// BenchmarkDistinctKeys: a million distinct global keys (a per-tenant
// limit of 100 a minute), each asked once, as fast as 2,000 callers at
// one instance ask them, the home 150 ms away: the requests refused, the
// most counters the instance held, its calls to the home a second, its
// heap at the end, and the counters held 7 s after. One run: go test -run
// XXX -bench DistinctKeys -benchtime 1x ./internal/global/ (about two
// minutes).
func BenchmarkDistinctKeys(b *testing.B) {
	for range b.N {
		reg := prometheus.NewRegistry()
		m := global.NewMetrics(reg)
		w := newWorld(b, 1, 1, func(int) time.Duration { return 150 * time.Millisecond }, 10*time.Millisecond, global.Options{Metrics: m})
		g := w.regions[0].instances[0]
		time.Sleep(time.Second) // the instance readies its connections to the home
		var ms runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&ms)
		heap0 := ms.HeapAlloc
		calls0 := homeCalls(b, w)
		var next, refused atomic.Int64
		var most atomic.Int64
		var wg sync.WaitGroup
		start := time.Now()
		wg.Go(func() {
			for next.Load() < int64(*benchKeys) {
				most.Store(max(most.Load(), int64(g.Counters())))
				time.Sleep(100 * time.Millisecond)
			}
		})
		for range *benchCallers {
			wg.Go(func() {
				for {
					n := next.Add(1)
					if n > int64(*benchKeys) {
						return
					}
					c := limit.Check{Key: fmt.Sprint("key", n), Limit: 100, WindowUS: 60e6, Hits: 1, Global: true}
					res, err := g.Evaluate(context.Background(), []limit.Check{c})
					if err != nil || res[0].Over {
						refused.Add(1)
					}
				}
			})
		}
		wg.Wait()
		took := time.Since(start)
		runtime.ReadMemStats(&ms)
		calls := float64(homeCalls(b, w)-calls0) / took.Seconds()
		fmt.Printf("%d distinct keys, %d callers, in %.0f s (%.0f keys/s): %d refused; counters held at most %d; calls to the home %.0f/s; heap +%d MiB; lost %.0f hits\n",
			*benchKeys, *benchCallers, took.Seconds(), float64(*benchKeys)/took.Seconds(), refused.Load(), most.Load(), calls,
			(int64(ms.HeapAlloc)-int64(heap0))>>20, testutil.ToFloat64(m.Hits.WithLabelValues("lost")))
		var hows []string
		for _, how := range []string{"local", "waited", "waited_out", "short"} {
			hows = append(hows, fmt.Sprintf("%s %.0f", how, testutil.ToFloat64(m.Requests.WithLabelValues(how))))
		}
		fmt.Printf("  decided: %s; hits given back %.0f\n", strings.Join(hows, ", "), testutil.ToFloat64(m.Hits.WithLabelValues("given_back")))
		time.Sleep(7 * time.Second)
		fmt.Printf("7 s later: counters held %d\n", g.Counters())
		w.close()
	}
}
