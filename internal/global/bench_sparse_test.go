package global_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
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

// BenchmarkSparseTenants is docs/regions.md's per-tenant scenario: three
// regions of two instances, 150 ms round trips to the home (10 ms
// jitter), a global limit per tenant of 100 a minute. It reports, for
// tenants each asking about once every 8 s, for a new tenant every
// request (20 a second), and for tenants idle 30 s then sending 50
// requests at once: the requests refused, the answer time of a request
// that found nothing held (cold: it waited for a draw) and of one decided
// from what was held (warm), p50 and p99; then, for many distinct keys
// each touched once, the entries held, the calls to the home a second
// and the heap. One run: go test -run XXX -bench SparseTenants
// -benchtime 1x ./internal/global/ (about two minutes).
func BenchmarkSparseTenants(b *testing.B) {
	for range b.N {
		runSparse(b)
	}
}

// sparseStats gathers a scenario's answers.
type sparseStats struct {
	mu             sync.Mutex
	asked, refused int
	cold, warm     []time.Duration
	coldCut        time.Duration
}

func (st *sparseStats) add(took time.Duration, ok bool) {
	st.mu.Lock()
	defer st.mu.Unlock()
	st.asked++
	if !ok {
		st.refused++
	}
	// A decision from what is held takes microseconds; one that waited
	// for a draw, a round trip.
	if took < st.coldCut {
		st.warm = append(st.warm, took)
	} else {
		st.cold = append(st.cold, took)
	}
}

func (st *sparseStats) String() string {
	st.mu.Lock()
	defer st.mu.Unlock()
	med := func(ds []time.Duration) time.Duration { return quantile(append([]time.Duration(nil), ds...), 50) }
	return fmt.Sprintf("%d asked, %d refused; cold %d: p50 %v p99 %v; warm %d: p50 %v p99 %v", st.asked, st.refused,
		len(st.cold), med(st.cold), p99(st.cold), len(st.warm), med(st.warm), p99(st.warm))
}

// quantile is the q-th percentile of ds (sorted in place).
func quantile(ds []time.Duration, q int) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	slices.Sort(ds)
	return ds[len(ds)*q/100]
}

// counters is the global counters the instances hold state of.
func counters(gs []*global.Store) int {
	n := 0
	for _, g := range gs {
		n += g.Counters()
	}
	return n
}

// homeCalls is the script calls the home has run.
func homeCalls(b *testing.B, w *world) int64 {
	st, err := w.home.CommandStats(context.Background())
	if err != nil {
		b.Fatal(err)
	}
	return st["evalsha"] + st["eval"]
}

func runSparse(b *testing.B) {
	const lim = 100
	tenant := func(name string) limit.Check {
		return limit.Check{Key: "tenant:" + name, Limit: lim, WindowUS: 60e6, Hits: 1, Global: true}
	}
	var instances []*global.Store
	reg := prometheus.NewRegistry()
	m := global.NewMetrics(reg)
	w := newBenchWorld(b, global.Options{Metrics: m})
	for _, r := range w.regions {
		instances = append(instances, r.instances...)
	}
	ask := func(st *sparseStats, g *global.Store, c limit.Check) {
		start := time.Now()
		res, err := g.Evaluate(context.Background(), []limit.Check{c})
		st.add(time.Since(start), err == nil && !res[0].Over)
	}
	// The instances ready their connections to the home as they start.
	time.Sleep(time.Second)
	const cut = 20 * time.Millisecond
	// 300 tenants, each asking about once every 8 s (exponential gaps),
	// from a random instance, for 40 s.
	sparse := &sparseStats{coldCut: cut}
	var wg sync.WaitGroup
	stop := time.Now().Add(40 * time.Second)
	for i := range 300 {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(i), 8))
			for {
				time.Sleep(time.Duration(rng.ExpFloat64() * 8 * float64(time.Second)))
				if time.Now().After(stop) {
					return
				}
				ask(sparse, instances[rng.IntN(len(instances))], tenant(fmt.Sprint("sparse", i)))
			}
		})
	}
	// A new tenant every request, 20 a second, meanwhile.
	fresh := &sparseStats{coldCut: cut}
	wg.Go(func() {
		rng := rand.New(rand.NewPCG(20, 1))
		for n := 0; time.Now().Before(stop); n++ {
			time.Sleep(time.Duration(rng.ExpFloat64() / 20 * float64(time.Second)))
			g := instances[rng.IntN(len(instances))]
			wg.Go(func() { ask(fresh, g, tenant(fmt.Sprint("fresh", n))) })
		}
	})
	wg.Wait()
	fmt.Printf("300 tenants, about one request per 8 s each: %v\n", sparse)
	fmt.Printf("a new tenant every request, 20/s: %v\n", fresh)
	hows := func() string {
		var out []string
		for _, how := range []string{"local", "waited", "waited_out", "short"} {
			out = append(out, fmt.Sprintf("%s %.0f", how, testutil.ToFloat64(m.Requests.WithLabelValues(how))))
		}
		return strings.Join(out, ", ")
	}
	fmt.Printf("  decided so far: %s\n", hows())
	// Tenants idle 30 s (asked once, then nothing), then 50 requests at
	// once to one instance each.
	burst := &sparseStats{coldCut: cut}
	for i := range 6 {
		ask(&sparseStats{coldCut: cut}, instances[i], tenant(fmt.Sprint("burst", i)))
	}
	time.Sleep(30 * time.Second)
	for i := range 6 {
		for range 50 {
			wg.Go(func() { ask(burst, instances[i], tenant(fmt.Sprint("burst", i))) })
		}
	}
	wg.Wait()
	fmt.Printf("6 tenants idle 30 s, then 50 requests at once each (limit %d/min): %v\n", lim, burst)
	fmt.Printf("  decided so far: %s\n", hows())
	// Distinct keys touched once each, as fast as one instance takes
	// them for 10 s: what it holds and how often it calls the home.
	g := instances[0]
	var ms runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&ms)
	heap0 := ms.HeapAlloc
	var n atomic.Int64
	distinct := &sparseStats{coldCut: cut}
	calls0 := homeCalls(b, w)
	start := time.Now()
	end := start.Add(10 * time.Second)
	for range 64 {
		wg.Go(func() {
			for time.Now().Before(end) {
				ask(distinct, g, tenant(fmt.Sprint("distinct", n.Add(1))))
			}
		})
	}
	wg.Wait()
	runtime.ReadMemStats(&ms)
	calls := float64(homeCalls(b, w)-calls0) / time.Since(start).Seconds()
	fmt.Printf("distinct keys touched once for 10 s, 64 callers on one instance: %d keys, %v; counters held at the end %d (all instances), calls to the home %.0f/s, heap +%d MiB\n",
		n.Load(), distinct, counters(instances), calls, (int64(ms.HeapAlloc)-int64(heap0))>>20)
	fmt.Printf("  decided so far: %s\n", hows())
	time.Sleep(7 * time.Second)
	fmt.Printf("7 s later: counters held %d\n", counters(instances))
	w.close()
}
