package redisstore

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"

	"github.com/ratelimitd/ratelimitd/internal/limit"
	"github.com/ratelimitd/ratelimitd/internal/redistest"
)

// BenchmarkScript measures what Redis spends on the decide script alone:
// batches of requests of one or three keys sent back to back (no
// contention from concurrent callers), Redis's own CPU time (INFO cpu)
// divided by the decisions (requests), reported as redis-µs/decision.
// Run with
// go test -run XXX -bench Script ./internal/redisstore/
func BenchmarkScript(b *testing.B) {
	srv := redistest.Start(b)
	for _, algo := range []limit.Algorithm{limit.FixedWindow, limit.SlidingWindow, limit.TokenBucket} {
		for _, bt := range []struct{ batch, keys int }{{1, 1}, {10, 1}, {64, 1}, {10, 3}, {64, 3}} {
			batch := bt.batch
			b.Run(fmt.Sprintf("algo=%d/batch=%d/keys=%d", algo, batch, bt.keys), func(b *testing.B) {
				s := pingedStore(b, Options{URL: srv.URL(), Dispatchers: -1})
				ctx := context.Background()
				reqs := make([][]limit.Check, batch)
				n := 0
				cpu0 := redisCPU(b, srv)
				b.ResetTimer()
				for b.Loop() {
					for i := range batch {
						reqs[i] = reqs[i][:0]
						for j := range bt.keys {
							key := "bench:" + strconv.Itoa(j) + ":" + strconv.Itoa(n%10000)
							reqs[i] = append(reqs[i], limit.Check{Key: key, Limit: 1e9, WindowUS: 3600e6, Hits: 1, Algorithm: algo})
						}
						n++
					}
					if _, err := s.run(ctx, reqs); err != nil {
						b.Fatal(err)
					}
				}
				b.StopTimer()
				b.ReportMetric((redisCPU(b, srv)-cpu0)*1e6/float64(n), "redis-µs/decision")
			})
		}
	}
}

// pingedStore returns a store that has reached Redis and loaded the
// script, closed when the test ends.
func pingedStore(tb testing.TB, opts Options) *Store {
	tb.Helper()
	s, err := New(opts)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { s.Close() })
	if err := s.Ping(context.Background()); err != nil {
		tb.Fatal(err)
	}
	return s
}

// redisCPU is the server's user+system CPU seconds so far.
func redisCPU(b *testing.B, srv *redistest.Server) float64 {
	info, err := srv.Client().Info(context.Background(), "cpu").Result()
	if err != nil {
		b.Fatal(err)
	}
	var sum float64
	for _, line := range strings.Split(info, "\n") {
		for _, f := range []string{"used_cpu_sys:", "used_cpu_user:"} {
			if v, ok := strings.CutPrefix(strings.TrimSpace(line), f); ok {
				x, _ := strconv.ParseFloat(v, 64)
				sum += x
			}
		}
	}
	return sum
}
