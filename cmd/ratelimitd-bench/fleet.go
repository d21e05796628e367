package main

import (
	"context"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// fleetOptions drive several instances sharing one counter (-fleet).
type fleetOptions struct {
	addrs   []string
	pids    []int
	split   string // even, or skewed: the first instance takes half
	key     string // the descriptor key of the leased rule
	window  time.Duration
	limit   float64
	windows int
}

// runFleet offers o.rate requests a second, all on one counter, split
// over the instances, from a window boundary for f.windows windows, and
// reports per window what the fleet admitted against the limit, then
// latency and the CPU and round trips per decision. A request is counted
// in the window its answer names: the instances' --decision-metadata
// gives the µs to the reset (exact for any window); without it,
// duration_until_reset, whole seconds, names windows of 10 s or more;
// else the middle of the round trip decides, and round trips that span
// a boundary are reported apart.
func runFleet(ctx context.Context, o *options, f *fleetOptions, out io.Writer) error {
	clients := make([][]rlsv3.RateLimitServiceClient, len(f.addrs))
	for i, a := range f.addrs {
		for range o.conns {
			cc, err := grpc.NewClient(a, grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				return err
			}
			defer cc.Close()
			clients[i] = append(clients[i], rlsv3.NewRateLimitServiceClient(cc))
		}
	}
	// Cumulative shares of the instances.
	cum := make([]float64, len(f.addrs))
	for i := range cum {
		w := 1 / float64(len(f.addrs))
		if f.split == "skewed" && len(f.addrs) > 1 {
			w = 0.5 / float64(len(f.addrs)-1)
			if i == 0 {
				w = 0.5
			}
		}
		cum[i] = w
		if i > 0 {
			cum[i] += cum[i-1]
		}
	}
	pick := func(k uint64) int {
		// A low-discrepancy sequence: the split holds over any span.
		x := math.Mod(float64(k)*0.6180339887498949, 1)
		for i, c := range cum {
			if x < c {
				return i
			}
		}
		return len(cum) - 1
	}
	req := &rlsv3.RateLimitRequest{Domain: o.domain, Descriptors: []*rlcommon.RateLimitDescriptor{
		{Entries: []*rlcommon.RateLimitDescriptor_Entry{{Key: f.key, Value: "hot"}}}}}
	type tally struct{ offered, admitted, errors atomic.Int64 }
	tallies := make([]tally, f.windows+2)
	var straddle, exact atomic.Int64
	var lat latencies
	w := f.window
	first := time.Now().Truncate(w).Add(w)
	// Warm up in the window before: grants and connections in place.
	warm := first.Add(-w / 2)
	time.Sleep(time.Until(warm))
	interval := time.Duration(float64(time.Second) / o.rate)
	end := first.Add(time.Duration(f.windows) * w)
	due := make(chan time.Time, 10000)
	var wg sync.WaitGroup
	var seq atomic.Uint64
	for range o.senders {
		wg.Go(func() {
			for intended := range due {
				k := seq.Add(1)
				inst := pick(k)
				c := clients[inst][k%uint64(len(clients[inst]))]
				sent := time.Now()
				resp, err := c.ShouldRateLimit(context.Background(), req)
				got := time.Now()
				if intended.Before(first) {
					continue
				}
				lat.add(got.Sub(intended))
				if sent.Truncate(w) != got.Truncate(w) {
					straddle.Add(1)
				}
				at := sent.Add(got.Sub(sent) / 2)
				if us, ok := resetUS(resp); ok {
					// The window ending nearest to when the answer says.
					end := first.Add((got.Add(time.Duration(us)*time.Microsecond).Sub(first) + w/2).Truncate(w))
					at = end.Add(-w / 2)
					exact.Add(1)
				} else if d := resp.GetStatuses(); err == nil && w >= 10*time.Second && len(d) == 1 {
					// The window ends at the first multiple of w from
					// lo: the reset is rounded up to whole seconds.
					lo := sent.Add(d[0].GetDurationUntilReset().AsDuration() - time.Second)
					at = lo.Truncate(w)
					if at.Before(lo) {
						at = at.Add(w)
					}
					at = at.Add(-w / 2) // inside the window that ends there
				}
				idx := int(at.Sub(first) / w)
				if idx < 0 || idx >= len(tallies) {
					continue
				}
				t := &tallies[idx]
				t.offered.Add(1)
				switch {
				case err != nil:
					t.errors.Add(1)
				case resp.GetOverallCode() == rlsv3.RateLimitResponse_OK:
					t.admitted.Add(1)
				}
			}
		})
	}
	var before, after counters
	sampled := false
	var err error
	for k := 0; ctx.Err() == nil; k++ {
		intended := warm.Add(time.Duration(k) * interval)
		if !intended.Before(end) {
			break
		}
		if !sampled && !intended.Before(first) {
			if before, err = sampleFleet(ctx, o, f.pids); err != nil {
				break
			}
			sampled = true
		}
		if d := time.Until(intended); d > 0 {
			time.Sleep(d)
		}
		due <- intended
	}
	close(due)
	wg.Wait()
	if err != nil {
		return err
	}
	if after, err = sampleFleet(ctx, o, f.pids); err != nil {
		return err
	}
	fmt.Fprintf(out, "%d instances, %s split, %.0f req/s offered (%.2f x the limit of %.0f per %v)\n",
		len(f.addrs), f.split, o.rate, o.rate*w.Seconds()/f.limit, f.limit, w)
	var n int64
	worst := 0.0
	for i := range f.windows {
		t := &tallies[i]
		a := float64(t.admitted.Load())
		n += t.offered.Load()
		worst = max(worst, a/f.limit)
		fmt.Fprintf(out, "  window %d: offered %d, admitted %.0f = %.3f x limit, errors %d\n", i+1, t.offered.Load(), a, a/f.limit, t.errors.Load())
	}
	p50, p99, _, _ := lat.quantiles()
	fmt.Fprintf(out, "  highest admitted/limit %.3f; answers placed by their reset_us: %d; round trips spanning a window boundary: %d\n", worst, exact.Load(), straddle.Load())
	if n > 0 {
		fmt.Fprintf(out, "  per decision: %.4f Redis round trips, %.2f µs Redis CPU, %.2f µs service CPU (all instances); p50 %.0f µs, p99 %.0f µs\n",
			float64(after.evalsha-before.evalsha)/float64(n), (after.redisCPU-before.redisCPU)*1e6/float64(n),
			(after.serviceCPU-before.serviceCPU)*1e6/float64(n), p50, p99)
	}
	return nil
}

// resetUS is the µs to the reset of the answer's first descriptor, as
// --decision-metadata gives it.
func resetUS(resp *rlsv3.RateLimitResponse) (float64, bool) {
	ds := resp.GetDynamicMetadata().GetFields()["decisions"].GetListValue().GetValues()
	if len(ds) == 0 {
		return 0, false
	}
	v, ok := ds[0].GetStructValue().GetFields()["reset_us"]
	return v.GetNumberValue(), ok
}

// sampleFleet is sample over every instance's process.
func sampleFleet(ctx context.Context, o *options, pids []int) (counters, error) {
	one := *o
	one.pid = 0
	c, err := sample(ctx, &one)
	if err != nil {
		return c, err
	}
	for _, p := range pids {
		one = options{pid: p}
		s, err := sample(ctx, &one)
		if err != nil {
			return c, err
		}
		c.serviceCPU += s.serviceCPU
	}
	return c, nil
}

// parseFleet reads -fleet's addresses and -pids.
func parseFleet(addrs, pids string) ([]string, []int, error) {
	as := strings.Split(addrs, ",")
	var ps []int
	if pids != "" {
		for _, p := range strings.Split(pids, ",") {
			n, err := strconv.Atoi(p)
			if err != nil {
				return nil, nil, fmt.Errorf("-pids: %q", p)
			}
			ps = append(ps, n)
		}
	}
	return as, ps, nil
}
