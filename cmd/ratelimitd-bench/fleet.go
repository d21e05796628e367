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
	r := &fleetRun{o: o, f: f, w: f.window, tallies: make([]tally, f.windows+2)}
	for i, a := range f.addrs {
		r.clients = append(r.clients, nil)
		for range o.conns {
			cc, err := grpc.NewClient(a, grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				return err
			}
			defer cc.Close()
			r.clients[i] = append(r.clients[i], rlsv3.NewRateLimitServiceClient(cc))
		}
	}
	r.cum = shares(len(f.addrs), f.split)
	r.req = &rlsv3.RateLimitRequest{Domain: o.domain, Descriptors: []*rlcommon.RateLimitDescriptor{
		{Entries: []*rlcommon.RateLimitDescriptor_Entry{{Key: f.key, Value: "hot"}}}}}
	r.first = time.Now().Truncate(r.w).Add(r.w)
	// Warm up in the window before: grants and connections in place.
	warm := r.first.Add(-r.w / 2)
	time.Sleep(time.Until(warm))
	due := make(chan time.Time, 10000)
	var wg sync.WaitGroup
	for range o.senders {
		wg.Go(func() {
			for intended := range due {
				r.send(intended)
			}
		})
	}
	before, err := r.pace(ctx, warm, due)
	close(due)
	wg.Wait()
	if err != nil {
		return err
	}
	after, err := sampleFleet(ctx, o, f.pids)
	if err != nil {
		return err
	}
	r.report(out, before, after)
	return nil
}

// tally counts one window's requests.
type tally struct{ offered, admitted, errors atomic.Int64 }

// fleetRun is one -fleet measurement.
type fleetRun struct {
	o        *options
	f        *fleetOptions
	w        time.Duration
	clients  [][]rlsv3.RateLimitServiceClient
	cum      []float64 // cumulative shares of the instances
	req      *rlsv3.RateLimitRequest
	first    time.Time // the first measured window's start
	seq      atomic.Uint64
	tallies  []tally
	straddle atomic.Int64
	exact    atomic.Int64
	lat      latencies
}

// shares are the instances' cumulative shares of the traffic: even, or
// half to the first (skewed).
func shares(n int, split string) []float64 {
	cum := make([]float64, n)
	for i := range cum {
		w := 1 / float64(n)
		if split == "skewed" && n > 1 {
			w = 0.5 / float64(n-1)
			if i == 0 {
				w = 0.5
			}
		}
		cum[i] = w
		if i > 0 {
			cum[i] += cum[i-1]
		}
	}
	return cum
}

// pick is the instance of request k: a low-discrepancy sequence, so the
// split holds over any span.
func (r *fleetRun) pick(k uint64) int {
	x := math.Mod(float64(k)*0.6180339887498949, 1)
	for i, c := range r.cum {
		if x < c {
			return i
		}
	}
	return len(r.cum) - 1
}

// pace sends the intended times from warm to the end of the last window
// at -rate, and samples the processes when the first window starts.
func (r *fleetRun) pace(ctx context.Context, warm time.Time, due chan<- time.Time) (before counters, err error) {
	interval := time.Duration(float64(time.Second) / r.o.rate)
	end := r.first.Add(time.Duration(r.f.windows) * r.w)
	sampled := false
	for k := 0; ctx.Err() == nil; k++ {
		intended := warm.Add(time.Duration(k) * interval)
		if !intended.Before(end) {
			break
		}
		if !sampled && !intended.Before(r.first) {
			if before, err = sampleFleet(ctx, r.o, r.f.pids); err != nil {
				return before, err
			}
			sampled = true
		}
		if d := time.Until(intended); d > 0 {
			time.Sleep(d)
		}
		due <- intended
	}
	return before, nil
}

// send makes one request due at intended and tallies it in its window.
func (r *fleetRun) send(intended time.Time) {
	k := r.seq.Add(1)
	inst := r.pick(k)
	c := r.clients[inst][k%uint64(len(r.clients[inst]))]
	sent := time.Now()
	resp, err := c.ShouldRateLimit(context.Background(), r.req)
	got := time.Now()
	if intended.Before(r.first) {
		return
	}
	r.lat.add(got.Sub(intended))
	if sent.Truncate(r.w) != got.Truncate(r.w) {
		r.straddle.Add(1)
	}
	idx := int(r.decidedIn(sent, got, resp, err).Sub(r.first) / r.w)
	if idx < 0 || idx >= len(r.tallies) {
		return
	}
	t := &r.tallies[idx]
	t.offered.Add(1)
	switch {
	case err != nil:
		t.errors.Add(1)
	case resp.GetOverallCode() == rlsv3.RateLimitResponse_OK:
		t.admitted.Add(1)
	}
}

// decidedIn is a moment inside the window a request was decided in: by
// the answer's reset when it says, else the round trip's middle.
func (r *fleetRun) decidedIn(sent, got time.Time, resp *rlsv3.RateLimitResponse, err error) time.Time {
	w := r.w
	if us, ok := resetUS(resp); ok {
		// The window ending nearest to when the answer says.
		end := r.first.Add((got.Add(time.Duration(us)*time.Microsecond).Sub(r.first) + w/2).Truncate(w))
		r.exact.Add(1)
		return end.Add(-w / 2)
	}
	if d := resp.GetStatuses(); err == nil && w >= 10*time.Second && len(d) == 1 {
		// The window ends at the first multiple of w from lo: the reset
		// is rounded up to whole seconds.
		lo := sent.Add(d[0].GetDurationUntilReset().AsDuration() - time.Second)
		at := lo.Truncate(w)
		if at.Before(lo) {
			at = at.Add(w)
		}
		return at.Add(-w / 2) // inside the window that ends there
	}
	return sent.Add(got.Sub(sent) / 2)
}

// report prints what each window admitted against the limit, and the cost
// per decision.
func (r *fleetRun) report(out io.Writer, before, after counters) {
	o, f, w := r.o, r.f, r.w
	fmt.Fprintf(out, "%d instances, %s split, %.0f req/s offered (%.2f x the limit of %.0f per %v)\n",
		len(f.addrs), f.split, o.rate, o.rate*w.Seconds()/f.limit, f.limit, w)
	var n int64
	worst := 0.0
	for i := range f.windows {
		t := &r.tallies[i]
		a := float64(t.admitted.Load())
		n += t.offered.Load()
		worst = max(worst, a/f.limit)
		fmt.Fprintf(out, "  window %d: offered %d, admitted %.0f = %.3f x limit, errors %d\n", i+1, t.offered.Load(), a, a/f.limit, t.errors.Load())
	}
	p50, p99, _, _ := r.lat.quantiles()
	fmt.Fprintf(out, "  highest admitted/limit %.3f; answers placed by their reset_us: %d; round trips spanning a window boundary: %d\n", worst, r.exact.Load(), r.straddle.Load())
	if n > 0 {
		fmt.Fprintf(out, "  per decision: %.4f Redis round trips, %.2f µs Redis CPU, %.2f µs service CPU (all instances); p50 %.0f µs, p99 %.0f µs\n",
			float64(after.evalsha-before.evalsha)/float64(n), (after.redisCPU-before.redisCPU)*1e6/float64(n),
			(after.serviceCPU-before.serviceCPU)*1e6/float64(n), p50, p99)
	}
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
