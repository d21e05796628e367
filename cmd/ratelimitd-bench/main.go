// Command ratelimitd-bench loads a RateLimitService over gRPC and reports
// throughput and latency, closed loop (N callers back to back) or open
// loop (a fixed arrival rate, latency measured from each request's
// intended send time, so a stall shows instead of hiding). With -noop it
// is instead a RateLimitService that answers OK doing nothing: the gRPC
// ceiling of the machine. With -redis and -pid it also reports the Redis
// and service CPU per decision and the Redis round trips and commands per
// decision.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/ratelimitd/ratelimitd/internal/server"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "ratelimitd-bench:", err)
		os.Exit(1)
	}
}

type options struct {
	addr, noop, mode, domain, redisAddr string
	workers, conns, keys, descriptors   int
	senders                             int
	rate                                float64
	duration, warmup                    time.Duration
	over, asJSON                        bool
	pid                                 int
	metricsURL                          string
	dkey                                string
	hits                                string // how requests state their hits: none, request, descriptor
}

// Report is what one run measured.
type Report struct {
	Mode           string  `json:"mode"`
	Requests       int64   `json:"requests"`
	Errors         int64   `json:"errors"`
	OverLimit      int64   `json:"over_limit"`
	Seconds        float64 `json:"seconds"`
	RPS            float64 `json:"rps"`
	P50US          float64 `json:"p50_us"`
	P99US          float64 `json:"p99_us"`
	P999US         float64 `json:"p999_us"`
	MaxUS          float64 `json:"max_us"`
	RedisCPUUS     float64 `json:"redis_cpu_us_per_decision,omitempty"`
	RoundTrips     float64 `json:"redis_round_trips_per_decision,omitempty"`
	Commands       float64 `json:"redis_commands_per_decision,omitempty"`
	ServiceCPUUS   float64 `json:"service_cpu_us_per_decision,omitempty"`
	ServiceReads   float64 `json:"service_read_syscalls_per_decision,omitempty"`
	ServiceWrites  float64 `json:"service_write_syscalls_per_decision,omitempty"`
	Pipelines      float64 `json:"redis_pipelines_per_decision,omitempty"`
	MeanBatch      float64 `json:"mean_batch,omitempty"`
	Descriptors    int     `json:"descriptors"`
	Keys           int     `json:"keys"`
	RateRequested  float64 `json:"rate_requested,omitempty"`
	LateP99US      float64 `json:"send_late_p99_us,omitempty"`
	LateMaxUS      float64 `json:"send_late_max_us,omitempty"`
	WorkersOrInfly int     `json:"workers"`
}

func run(ctx context.Context, args []string, out io.Writer) error {
	var o options
	var f fleetOptions
	var b budgetOptions
	var ro rollingOptions
	var fleet, pids string
	var budget, rolling bool
	fs := flag.NewFlagSet("ratelimitd-bench", flag.ContinueOnError)
	loadFlags(fs, &o)
	fleetFlags(fs, &f, &fleet, &pids)
	budgetFlags(fs, &b, &budget)
	rollingFlags(fs, &ro, &rolling)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if budget && !b.valid() {
		return errors.New("-budget: want -streams >= 1, 1 <= -tokens-min <= -tokens-max, -stream-min <= -stream-max, -skewed <= -streams")
	}
	if fleet != "" {
		var err error
		if f.addrs, f.pids, err = parseFleet(fleet, pids); err != nil {
			return err
		}
		return runFleet(ctx, &o, &f, out)
	}
	if o.noop != "" {
		return serveNoop(ctx, o.noop)
	}
	if err := o.validate(); err != nil {
		return err
	}
	clients := make([]rlsv3.RateLimitServiceClient, o.conns)
	for i := range clients {
		cc, err := grpc.NewClient(o.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			return err
		}
		defer cc.Close()
		clients[i] = rlsv3.NewRateLimitServiceClient(cc)
	}
	if budget {
		return runBudget(ctx, &o, &b, clients, out)
	}
	if rolling {
		return runRolling(ctx, &o, &ro, clients[0], out)
	}
	r, err := measure(ctx, &o, clients)
	if err != nil {
		return err
	}
	if o.asJSON {
		return json.NewEncoder(out).Encode(r)
	}
	r.print(out, &o)
	return nil
}

// validate refuses a load the tool cannot make.
func (o *options) validate() error {
	if o.hits != "none" && o.hits != "request" && o.hits != "descriptor" {
		return fmt.Errorf("-hits %q: want none, request or descriptor", o.hits)
	}
	if o.mode != "closed" && o.mode != "open" {
		return fmt.Errorf("-mode %q: want closed or open", o.mode)
	}
	if o.descriptors < 1 || o.descriptors > 3 {
		return errors.New("-descriptors must be 1, 2 or 3")
	}
	return nil
}

func loadFlags(fs *flag.FlagSet, o *options) {
	fs.StringVar(&o.addr, "addr", "127.0.0.1:8081", "gRPC address of the service under load")
	fs.StringVar(&o.noop, "noop", "", "serve a no-op RateLimitService on this address instead of loading one")
	fs.StringVar(&o.mode, "mode", "closed", "closed (workers back to back) or open (fixed -rate)")
	fs.IntVar(&o.workers, "c", 64, "closed loop: concurrent callers")
	fs.Float64Var(&o.rate, "rate", 1000, "open loop: requests per second")
	fs.IntVar(&o.senders, "senders", 256, "open loop: goroutines sending the due requests")
	fs.IntVar(&o.conns, "conns", 4, "gRPC connections")
	fs.IntVar(&o.keys, "keys", 10000, "distinct descriptor values")
	fs.IntVar(&o.descriptors, "descriptors", 1, "descriptors per request (keys d0, d1, d2 of deploy/bench/rules.yaml)")
	fs.StringVar(&o.dkey, "dkey", "", "descriptor key instead of d0 (with -descriptors 1): lease_hot, exact_hot")
	fs.BoolVar(&o.over, "over", false, "every request on the always-over key (scenario C)")
	fs.StringVar(&o.hits, "hits", "none", "how each request states its one hit: none (hits_addend unset), request (request-level hits_addend 1) or descriptor (each descriptor's hits_addend 1), the same request to a plain limit")
	fs.StringVar(&o.domain, "domain", "bench", "domain")
	fs.DurationVar(&o.duration, "duration", 10*time.Second, "measured duration")
	fs.DurationVar(&o.warmup, "warmup", 2*time.Second, "unmeasured load first")
	fs.StringVar(&o.redisAddr, "redis", "", "Redis host:port: report its CPU, round trips and commands per decision")
	fs.StringVar(&o.metricsURL, "metrics", "", "the service's /metrics URL: report pipelines (round trips) per decision and the mean batch")
	fs.IntVar(&o.pid, "pid", 0, "the service's process id: report its CPU per decision")
	fs.BoolVar(&o.asJSON, "json", false, "print the report as JSON")
}

func fleetFlags(fs *flag.FlagSet, f *fleetOptions, fleet, pids *string) {
	fs.StringVar(fleet, "fleet", "", "instances sharing one counter, host:port,...: offer -rate (open loop) on one key split over them, and report what the fleet admits per window")
	fs.StringVar(pids, "pids", "", "-fleet: the instances' process ids, for their CPU per decision")
	fs.StringVar(&f.split, "split", "even", "-fleet: even, or skewed (the first instance takes half the traffic)")
	fs.StringVar(&f.key, "key", "lease_s", "-fleet: the descriptor key of the counter")
	fs.DurationVar(&f.window, "window", time.Second, "-fleet: the counter's window")
	fs.Float64Var(&f.limit, "limit", 1000, "-fleet: the counter's limit per window")
	fs.IntVar(&f.windows, "windows", 5, "-fleet: windows measured")
}

func budgetFlags(fs *flag.FlagSet, b *budgetOptions, budget *bool) {
	fs.BoolVar(budget, "budget", false, "token budget: -streams concurrent streams, each a check (hits_addend 0), a stream, and a charge of its tokens, on the \"budget\" key for -duration; report the tokens let through over -budget-limit and the false refusals")
	fs.Uint64Var(&b.budget, "budget-limit", 1_000_000, "-budget: the budget rule's requests_per_unit")
	fs.StringVar(&b.key, "budget-key", "budget", "-budget: the budget rule's descriptor key (deploy/bench/rules.yaml: budget, 1,000,000 an hour; budget_100k)")
	fs.IntVar(&b.streams, "streams", 64, "-budget: concurrent streams")
	fs.IntVar(&b.skewed, "skewed", 0, "-budget: how many of the streams are 20 times longer and larger")
	fs.Uint64Var(&b.minTok, "tokens-min", 1000, "-budget: fewest tokens of a stream")
	fs.Uint64Var(&b.maxTok, "tokens-max", 4000, "-budget: most tokens of a stream")
	fs.DurationVar(&b.minDur, "stream-min", 20*time.Millisecond, "-budget: shortest stream")
	fs.DurationVar(&b.maxDur, "stream-max", 200*time.Millisecond, "-budget: longest stream")
	fs.DurationVar(&b.retry, "retry", 50*time.Millisecond, "-budget: wait after a refused check before the next")
	fs.Float64Var(&b.failRate, "fail-rate", 0, "-budget: share of streams that fail and never charge")
	fs.StringVar(&b.failShape, "fail-shape", "none", "-budget: a failed stream sends no stream-end call (none) or one of 0 hits (zero)")
	fs.BoolVar(&b.kinds, "kinds", false, "-budget: AI Gateway's five token kinds, a budget each (kind_* of deploy/bench/rules.yaml; kind_total is -budget-limit), charged in one stream-end call")
	fs.Float64Var(&b.zeroRate, "zero-rate", 0.9, "-kinds: share of streams whose cached kind is charged 0")
	fs.BoolVar(&b.quota, "quota", false, "-budget: QuotaPolicy's shape: the request-phase check states no hits")
	fs.IntVar(&b.requests, "requests", 0, "-budget: requests each stream sends, then stops (0: until -duration)")
	fs.IntVar(&b.flood, "flood", 0, "-budget: uncharged checks (hits 0) one more sharer sends from -flood-at, 8 at a time")
	fs.DurationVar(&b.floodAt, "flood-at", 2*time.Second, "-budget: when the flood starts")
	fs.BoolVar(&b.pair, "pair", false, "-budget: each request's two calls carry its id, an x-request-id entry after the budget's (the rule's request_id level: -budget-key budget_pair)")
	fs.StringVar(&b.retryPolicy, "retry-policy", "fixed", "-budget: fixed (wait -retry after each refusal) or sdk (as OpenAI's SDK: ~0.5 s, then ~1 s, then the request is given up)")
	fs.StringVar(&b.sequence, "sequence", "", "-budget: a scripted sequence on -budget-limit instead of streams: uncharged (check, charge a quarter, three uncharged checks, then how long until a check is admitted), large (check, charge 60 %, check)")
}

// measure warms up, then loads for -duration between two samples of the
// processes' counters, and reports.
func measure(ctx context.Context, o *options, clients []rlsv3.RateLimitServiceClient) (Report, error) {
	if o.warmup > 0 {
		wctx, cancel := context.WithTimeout(ctx, o.warmup)
		load(wctx, o, clients, nil, nil)
		cancel()
	}
	before, err := sample(ctx, o)
	if err != nil {
		return Report{}, err
	}
	mctx, cancel := context.WithTimeout(ctx, o.duration)
	defer cancel()
	var lat, late latencies
	start := time.Now()
	n, errs, over := load(mctx, o, clients, &lat, &late)
	elapsed := time.Since(start).Seconds()
	after, err := sample(ctx, o)
	if err != nil {
		return Report{}, err
	}
	r := Report{Mode: o.mode, Requests: n, Errors: errs, OverLimit: over, Seconds: elapsed, RPS: float64(n) / elapsed,
		Descriptors: o.descriptors, Keys: o.keys, WorkersOrInfly: o.workers}
	if o.mode == "open" {
		r.RateRequested = o.rate
		_, r.LateP99US, _, r.LateMaxUS = late.quantiles()
	}
	r.P50US, r.P99US, r.P999US, r.MaxUS = lat.quantiles()
	r.per(o, before, after)
	return r, nil
}

// per fills in what the processes spent per decision between two samples.
func (r *Report) per(o *options, before, after counters) {
	n := r.Requests
	if n > 0 && o.redisAddr != "" {
		r.RedisCPUUS = (after.redisCPU - before.redisCPU) * 1e6 / float64(n)
		r.RoundTrips = float64(after.evalsha-before.evalsha) / float64(n)
		r.Commands = float64(after.commands-before.commands) / float64(n)
	}
	if n > 0 && o.metricsURL != "" {
		r.Pipelines = (after.batches - before.batches) / float64(n)
		if after.batches > before.batches {
			r.MeanBatch = (after.batched - before.batched) / (after.batches - before.batches)
		}
	}
	if n > 0 && o.pid > 0 {
		r.ServiceCPUUS = (after.serviceCPU - before.serviceCPU) * 1e6 / float64(n)
		r.ServiceReads = float64(after.reads-before.reads) / float64(n)
		r.ServiceWrites = float64(after.writes-before.writes) / float64(n)
	}
}

// print writes the report as the scripts read it.
func (r *Report) print(out io.Writer, o *options) {
	fmt.Fprintf(out, "%s loop, %d descriptor(s), %d keys: %d requests in %.1fs = %.0f req/s; errors %d, over limit %d\n",
		r.Mode, r.Descriptors, r.Keys, r.Requests, r.Seconds, r.RPS, r.Errors, r.OverLimit)
	fmt.Fprintf(out, "latency p50 %.0fµs  p99 %.0fµs  p999 %.0fµs  max %.0fµs\n", r.P50US, r.P99US, r.P999US, r.MaxUS)
	if r.Mode == "open" {
		fmt.Fprintf(out, "of which the load tool's own lateness in sending: p99 %.0fµs  max %.0fµs\n", r.LateP99US, r.LateMaxUS)
	}
	if o.redisAddr != "" {
		fmt.Fprintf(out, "redis: %.2f µs CPU, %.3f round trips, %.2f commands per decision\n", r.RedisCPUUS, r.RoundTrips, r.Commands)
	}
	if o.pid > 0 {
		fmt.Fprintf(out, "service: %.2f µs CPU, %.3f read and %.3f write system calls per decision\n", r.ServiceCPUUS, r.ServiceReads, r.ServiceWrites)
	}
	if o.metricsURL != "" {
		fmt.Fprintf(out, "batching: %.3f pipelines (round trips) per decision, mean batch %.1f\n", r.Pipelines, r.MeanBatch)
	}
}

// load sends requests until ctx is done and returns the count, errors and
// OVER_LIMIT answers.
func load(ctx context.Context, o *options, clients []rlsv3.RateLimitServiceClient, lat, late *latencies) (n, errs, over int64) {
	var cn, ce, co atomic.Int64
	var seq atomic.Uint64
	one := func(intended time.Time) {
		i := seq.Add(1)
		req := request(o, i)
		resp, err := clients[i%uint64(len(clients))].ShouldRateLimit(context.Background(), req)
		took := time.Since(intended)
		cn.Add(1)
		switch {
		case err != nil:
			ce.Add(1)
		case resp.GetOverallCode() == rlsv3.RateLimitResponse_OVER_LIMIT:
			co.Add(1)
		}
		if lat != nil {
			lat.add(took)
		}
	}
	var wg sync.WaitGroup
	switch o.mode {
	case "closed":
		for range o.workers {
			wg.Go(func() {
				for ctx.Err() == nil {
					one(time.Now())
				}
			})
		}
	case "open":
		interval := time.Duration(float64(time.Second) / o.rate)
		start := time.Now()
		// Each request is due at its intended time, however long the
		// previous ones take; a pool of senders takes them (a goroutine
		// per request spent more CPU than the server under load: each one
		// grew its stack through the gRPC client again). At most 10000
		// wait; a sender records how late it picked its request up, the
		// tool's own share of the latency.
		due := make(chan time.Time, 10000)
		for range o.senders {
			wg.Go(func() {
				for intended := range due {
					if late != nil {
						late.add(time.Since(intended))
					}
					one(intended)
				}
			})
		}
		for k := 0; ctx.Err() == nil; k++ {
			intended := start.Add(time.Duration(k) * interval)
			if d := time.Until(intended); d > 0 {
				time.Sleep(d)
			}
			due <- intended
		}
		close(due)
	}
	wg.Wait()
	return cn.Load(), ce.Load(), co.Load()
}

func request(o *options, i uint64) *rlsv3.RateLimitRequest {
	v := strconv.FormatUint(i%uint64(o.keys), 10)
	req := &rlsv3.RateLimitRequest{Domain: o.domain}
	if o.over {
		req.Descriptors = []*rlcommon.RateLimitDescriptor{{Entries: []*rlcommon.RateLimitDescriptor_Entry{{Key: "over", Value: v}}}}
		return req
	}
	for d := range o.descriptors {
		key := "d" + strconv.Itoa(d)
		if o.dkey != "" {
			key = o.dkey
		}
		d := &rlcommon.RateLimitDescriptor{Entries: []*rlcommon.RateLimitDescriptor_Entry{{Key: key, Value: v}}}
		if o.hits == "descriptor" {
			d.HitsAddend = wrapperspb.UInt64(1)
		}
		req.Descriptors = append(req.Descriptors, d)
	}
	if o.hits == "request" {
		req.HitsAddend = 1
	}
	return req
}

// latencies collects samples safely.
type latencies struct {
	mu sync.Mutex
	d  []time.Duration
}

func (l *latencies) add(d time.Duration) {
	l.mu.Lock()
	l.d = append(l.d, d)
	l.mu.Unlock()
}

func (l *latencies) quantiles() (p50, p99, p999, mx float64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.d) == 0 {
		return
	}
	slices.Sort(l.d)
	at := func(q float64) float64 { return float64(l.d[min(len(l.d)-1, int(q*float64(len(l.d))))].Microseconds()) }
	return at(0.5), at(0.99), at(0.999), float64(l.d[len(l.d)-1].Microseconds())
}

// noop answers OK to everything without looking at it.
type noop struct {
	rlsv3.UnimplementedRateLimitServiceServer
}

func (noop) ShouldRateLimit(context.Context, *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	return &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK}, nil
}

func serveNoop(ctx context.Context, addr string) error {
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	srv := grpc.NewServer(server.TransportOptions()...)
	rlsv3.RegisterRateLimitServiceServer(srv, noop{})
	go func() {
		<-ctx.Done()
		srv.GracefulStop()
	}()
	fmt.Fprintln(os.Stderr, "no-op RateLimitService on", lis.Addr())
	return srv.Serve(lis)
}
