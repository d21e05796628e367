package redisstore

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"

	"github.com/ratelimitd/ratelimitd/internal/limit"
	"github.com/ratelimitd/ratelimitd/internal/redisstore/redistest"
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

// BenchmarkExact measures the service's side of an exact decision: 64
// callers at once through Evaluate, the batcher and one dispatcher to a
// private redis-server, as scenario A drives them but without gRPC. It
// reports this process's CPU per decision (getrusage; the benchmark's
// own loop is a few ns of it) as service-µs/decision, Redis's as
// redis-µs/decision, and the mean batch. Run with
// go test -run XXX -bench Exact -benchmem ./internal/redisstore/
func BenchmarkExact(b *testing.B) {
	srv := redistest.Start(b)
	s := pingedStore(b, Options{URL: srv.URL()})
	ctx := context.Background()
	var n atomic.Int64
	b.SetParallelism(32) // 64 callers on this 2-vCPU machine
	cpu0, redis0, calls0 := processCPU(b), redisCPU(b, srv), scriptCalls(b, srv)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		checks := make([]limit.Check, 1)
		for pb.Next() {
			i := n.Add(1)
			checks[0] = limit.Check{Key: "exact:" + strconv.FormatInt(i%10000, 10), Limit: 1e9, WindowUS: 3600e6, Hits: 1}
			if _, err := s.Evaluate(ctx, checks); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.StopTimer()
	d := float64(n.Load())
	b.ReportMetric((processCPU(b)-cpu0)*1e6/d, "service-µs/decision")
	b.ReportMetric((redisCPU(b, srv)-redis0)*1e6/d, "redis-µs/decision")
	b.ReportMetric(d/(scriptCalls(b, srv)-calls0), "batch")
}

// processCPU is this process's user+system CPU seconds so far.
func processCPU(b *testing.B) float64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return float64(ru.Utime.Nano()+ru.Stime.Nano()) / 1e9
}

// scriptCalls is how many EVALSHA calls the server has run.
func scriptCalls(b *testing.B, srv *redistest.Server) float64 {
	info, err := srv.Client().Info(context.Background(), "commandstats").Result()
	if err != nil {
		b.Fatal(err)
	}
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "cmdstat_evalsha:calls="); ok {
			calls, _, _ := strings.Cut(v, ",")
			x, _ := strconv.ParseFloat(calls, 64)
			return x
		}
	}
	return 0
}
