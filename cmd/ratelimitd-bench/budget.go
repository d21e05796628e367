package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// budgetOptions drive -budget: concurrent LLM-like streams spending one
// token budget the way Envoy AI Gateway and Envoy Gateway's cost do: a
// check with hits_addend 0 when the stream starts, the stream, then a
// charge of its tokens (apply_on_stream_done) whose answer is ignored;
// and the traffic those deployments really send beside it: streams that
// fail (no stream-end call, or one of 0), several token kinds charged at
// once (AI Gateway's five budgets, the cached kind 0 on most streams),
// request-phase calls stating no hits (QuotaPolicy), and one sharer
// flooding uncharged checks.
type budgetOptions struct {
	budget         uint64 // the rule's requests_per_unit (deploy/bench/rules.yaml)
	key            string // the rule's descriptor key
	streams        int
	minTok, maxTok uint64
	minDur, maxDur time.Duration
	skewed         int // streams 20 times longer and larger
	retry          time.Duration
	failRate       float64 // share of streams that fail
	failShape      string  // none: no stream-end call; zero: a stream-end call of 0
	kinds          bool    // AI Gateway's five token kinds, one budget each
	zeroRate       float64 // -kinds: share of streams whose cached kind is 0
	quota          bool    // QuotaPolicy: the check states no hits
	requests       int     // requests per stream, then it stops (0: until -duration)
	flood          int     // uncharged checks one more sharer sends
	floodAt        time.Duration
	sequence       string // a scripted sequence instead of streams: uncharged, large
	pair           bool   // each request's calls carry its id (an x-request-id entry)
	retryPolicy    string // fixed: -retry after each refusal; sdk: OpenAI's SDK (~0.5 s, ~1 s, then given up)
}

// BudgetReport is what -budget measured.
type BudgetReport struct {
	Streams        int     `json:"streams"`
	Skewed         int     `json:"skewed_streams"`
	Budget         uint64  `json:"budget"`
	Charged        uint64  `json:"tokens_charged"`
	LetThrough     float64 `json:"let_through_over_budget"`
	Admitted       int64   `json:"checks_admitted"`
	Refused        int64   `json:"checks_refused"`
	FalseRefusals  int64   `json:"false_refusals"`
	FalsePct       float64 `json:"false_refusals_pct_of_checks"`
	Failed         int64   `json:"streams_failed"`
	MaxGapMS       float64 `json:"max_admission_gap_ms"`
	CheckErrors    int64   `json:"check_errors"`
	ChargeErrors   int64   `json:"charge_errors"`
	FirstRefusalMS float64 `json:"first_refusal_ms"`
	Seconds        float64 `json:"seconds"`
	// The flood: the others' checks and false refusals while it lasted,
	// and from 10 s after it ended.
	FloodSeconds float64 `json:"flood_seconds,omitempty"`
	DuringChecks int64   `json:"others_checks_during_flood,omitempty"`
	DuringFalse  int64   `json:"others_false_refusals_during_flood,omitempty"`
	AfterChecks  int64   `json:"others_checks_from_10s_after,omitempty"`
	AfterFalse   int64   `json:"others_false_refusals_from_10s_after,omitempty"`
	FloodRefused int64   `json:"flood_checks_refused,omitempty"`
	// Blocked time: each false refusal counts the wait until its
	// stream's next call (s, over the streams); a block runs from a false
	// refusal to the stream's next admission or true refusal.
	BlockedPerStreamS float64 `json:"false_blocked_s_per_stream"`
	LongestBlockS     float64 `json:"longest_false_block_s"`
	// -retry-policy sdk: requests given up after three refusals, and of
	// them those the budget would have covered at the last refusal.
	GaveUp           int64   `json:"sdk_gave_up,omitempty"`
	FalseGaveUp      int64   `json:"sdk_false_gave_up,omitempty"`
	SequenceOKAfterS float64 `json:"sequence_ok_after_s,omitempty"`
	SequenceCode     string  `json:"sequence_code,omitempty"`
}

// valid reports whether the options make a budget run.
func (b *budgetOptions) valid() bool {
	return b.streams >= 1 && b.minTok >= 1 && b.maxTok >= b.minTok && b.maxDur >= b.minDur && b.skewed <= b.streams &&
		b.failRate >= 0 && b.failRate <= 1 && b.zeroRate >= 0 && b.zeroRate <= 1 &&
		(b.failShape == "none" || b.failShape == "zero") && (b.retryPolicy == "fixed" || b.retryPolicy == "sdk") &&
		(b.sequence == "" || b.sequence == "uncharged" || b.sequence == "large")
}

// kindKeys are the descriptor keys of AI Gateway's five token kinds in
// deploy/bench/rules.yaml; the first is the total, held to -budget-limit.
var kindKeys = []string{"kind_total", "kind_input", "kind_output", "kind_cached", "kind_reasoning"}

// budgetRun is one -budget run's shared state.
type budgetRun struct {
	o     *options
	b     *budgetOptions
	value string
	start time.Time

	charged, inflight                                         atomic.Uint64
	admitted, refused, falseRef, checkErrs, chargeErrs, fails atomic.Int64
	firstRefusal, lastAdmit, maxGap                           atomic.Int64
	floodStart, floodEnd                                      atomic.Int64
	duringChecks, duringFalse, afterChecks, afterFalse        atomic.Int64
	floodRefused                                              atomic.Int64
	blocked, longestBlock, gaveUp, falseGaveUp, ids           atomic.Int64
}

// request builds one call: the budget's descriptor (or the five kinds'),
// each stating hits (nil: none stated, QuotaPolicy's check), and ending
// with the request's id under -pair.
func (r *budgetRun) request(hits []uint64, stated bool, id string) *rlsv3.RateLimitRequest {
	keys := []string{r.b.key}
	if r.b.kinds {
		keys = kindKeys
	}
	req := &rlsv3.RateLimitRequest{Domain: r.o.domain}
	for i, k := range keys {
		d := &rlcommon.RateLimitDescriptor{Entries: []*rlcommon.RateLimitDescriptor_Entry{{Key: k, Value: r.value}}}
		if r.b.pair {
			d.Entries = append(d.Entries, &rlcommon.RateLimitDescriptor_Entry{Key: "x-request-id", Value: id})
		}
		if stated {
			d.HitsAddend = wrapperspb.UInt64(hits[min(i, len(hits)-1)])
		}
		req.Descriptors = append(req.Descriptors, d)
	}
	return req
}

// usage is what one stream charges, per kind: the total, then input,
// output, cached (0 on -zero-rate of streams) and reasoning (0 on half).
func (r *budgetRun) usage(rng *rand.Rand, size uint64) []uint64 {
	if !r.b.kinds {
		return []uint64{size}
	}
	cached, reasoning := size/4, size/5
	if rng.Float64() < r.b.zeroRate {
		cached = 0
	}
	if rng.IntN(2) == 0 {
		reasoning = 0
	}
	return []uint64{size, size * 2 / 5, size * 3 / 5, cached, reasoning}
}

// runBudget runs the streams for o.duration on a fresh counter and waits
// for the streams in flight to charge. A refusal is false when the
// budget, with every admitted stream's tokens charged (the bench knows
// them; the service only estimates), would still have covered the
// refused stream.
func runBudget(ctx context.Context, o *options, b *budgetOptions, clients []rlsv3.RateLimitServiceClient, out io.Writer) error {
	r := &budgetRun{o: o, b: b, value: fmt.Sprintf("run-%d", time.Now().UnixNano()), start: time.Now()}
	if b.sequence != "" {
		return r.runSequence(ctx, clients[0], out)
	}
	lctx, cancel := context.WithTimeout(ctx, o.duration)
	defer cancel()
	var wg sync.WaitGroup
	for i := range b.streams {
		rng := rand.New(rand.NewPCG(uint64(i), uint64(r.start.UnixNano())))
		cl := clients[i%len(clients)]
		scale := uint64(1)
		if i < b.skewed {
			scale = 20
		}
		wg.Go(func() { r.stream(lctx, cl, rng, scale) })
	}
	if b.flood > 0 {
		wg.Go(func() { r.floodChecks(lctx, clients) })
	}
	wg.Wait()
	return r.report(out)
}

// stream is one caller: check, stream, charge (or fail), again, until the
// run ends or it has sent -requests.
func (r *budgetRun) stream(ctx context.Context, cl rlsv3.RateLimitServiceClient, rng *rand.Rand, scale uint64) {
	b := r.b
	var blockSince time.Duration // a false block's start, or 0
	endBlock := func(now time.Duration) {
		if blockSince > 0 {
			if d := int64(now - blockSince); d > r.longestBlock.Load() {
				r.longestBlock.Store(d)
			}
			blockSince = 0
		}
	}
	defer func() { endBlock(time.Since(r.start)) }()
	tries := 0
	for n := 0; ctx.Err() == nil && (b.requests == 0 || n < b.requests); {
		size := scale * (b.minTok + rng.Uint64N(b.maxTok-b.minTok+1))
		dur := time.Duration(scale) * (b.minDur + time.Duration(rng.Int64N(int64(b.maxDur-b.minDur)+1)))
		id := fmt.Sprint(r.ids.Add(1))
		resp, err := cl.ShouldRateLimit(ctx, r.request([]uint64{0}, !b.quota, id))
		if ctx.Err() != nil {
			// The run ended while the check was out: the service may have
			// answered it by failure policy (no time left for Redis), which
			// is the load tool's deadline, not traffic.
			return
		}
		if err != nil {
			r.checkErrs.Add(1)
			sleepCtx(ctx, b.retry)
			continue
		}
		now := time.Since(r.start)
		falseRef := r.charged.Load()+r.inflight.Load()+size <= b.budget
		r.sharerCheck(now, resp.GetOverallCode() != rlsv3.RateLimitResponse_OK && falseRef)
		if resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
			r.refused.Add(1)
			r.firstRefusal.CompareAndSwap(0, int64(now))
			wait := b.retry
			if b.retryPolicy == "sdk" {
				// OpenAI's SDK: 0.5 s, then 1 s, each less up to a quarter
				// (jitter); after the third refusal the request is given up.
				wait = 500*time.Millisecond<<tries - time.Duration(rng.Int64N(int64(125*time.Millisecond<<tries)))
			}
			if falseRef {
				r.falseRef.Add(1)
				r.blocked.Add(int64(wait))
				if blockSince == 0 {
					blockSince = now
				}
			} else {
				endBlock(now)
			}
			if tries++; b.retryPolicy == "sdk" && tries == 3 {
				r.gaveUp.Add(1)
				if falseRef {
					r.falseGaveUp.Add(1)
				}
				tries = 0
			}
			sleepCtx(ctx, wait)
			continue
		}
		endBlock(now)
		tries = 0
		n++
		r.admit(now)
		r.inflight.Add(size)
		time.Sleep(dur) // a stream admitted runs to its end
		if rng.Float64() < b.failRate {
			// A failed stream never charges: Envoy drops the stream-end
			// descriptor, or sends it with 0.
			r.fails.Add(1)
			if b.failShape == "zero" {
				r.send(cl, r.request(make([]uint64, 5), true, id))
			}
			r.inflight.Add(^(size - 1))
			continue
		}
		// Envoy charges at stream end whatever the load test's clock says.
		r.send(cl, r.request(r.usage(rng, size), true, id))
		r.charged.Add(size)
		r.inflight.Add(^(size - 1))
	}
}

// send makes a stream-end call, whose answer nobody reads.
func (r *budgetRun) send(cl rlsv3.RateLimitServiceClient, req *rlsv3.RateLimitRequest) {
	cctx, ccancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer ccancel()
	if _, err := cl.ShouldRateLimit(cctx, req); err != nil {
		r.chargeErrs.Add(1)
	}
}

// admit counts an admission and the longest gap between two.
func (r *budgetRun) admit(now time.Duration) {
	r.admitted.Add(1)
	if last := r.lastAdmit.Swap(int64(now)); last > 0 && int64(now)-last > r.maxGap.Load() {
		r.maxGap.Store(int64(now) - last)
	}
}

// sharerCheck counts a check of the others against the flood's timeline.
func (r *budgetRun) sharerCheck(now time.Duration, falseRefusal bool) {
	fs, fe := r.floodStart.Load(), r.floodEnd.Load()
	switch {
	case fs > 0 && fe == 0 && int64(now) >= fs:
		r.duringChecks.Add(1)
		if falseRefusal {
			r.duringFalse.Add(1)
		}
	case fe > 0 && int64(now) >= fe+int64(10*time.Second):
		r.afterChecks.Add(1)
		if falseRefusal {
			r.afterFalse.Add(1)
		}
	}
}

// floodChecks is the sharer who sends -flood checks (hits 0) on the same
// budget from -flood-at on, 8 at a time, and never charges.
func (r *budgetRun) floodChecks(ctx context.Context, clients []rlsv3.RateLimitServiceClient) {
	sleepCtx(ctx, r.b.floodAt)
	if ctx.Err() != nil {
		return
	}
	r.floodStart.Store(int64(time.Since(r.start)))
	var left atomic.Int64
	left.Store(int64(r.b.flood))
	var wg sync.WaitGroup
	for i := range 8 {
		cl := clients[i%len(clients)]
		wg.Go(func() {
			for left.Add(-1) >= 0 && ctx.Err() == nil {
				resp, err := cl.ShouldRateLimit(ctx, r.request([]uint64{0}, !r.b.quota, "flood"))
				if err == nil && resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
					r.floodRefused.Add(1)
				}
			}
		})
	}
	wg.Wait()
	r.floodEnd.Store(int64(time.Since(r.start)))
}

// runSequence runs a scripted sequence on a fresh counter of -budget-limit:
// uncharged: check, charge a quarter of the budget, three checks whose
// charge never comes, then a check every 100 ms until one is admitted
// (reported: how long after the third); large: check, charge 60 % of
// the budget, check (reported: the last check's code).
func (r *budgetRun) runSequence(ctx context.Context, cl rlsv3.RateLimitServiceClient, out io.Writer) error {
	ask := func(hits uint64) (rlsv3.RateLimitResponse_Code, error) {
		resp, err := cl.ShouldRateLimit(ctx, r.request([]uint64{hits}, true, "sequence"))
		return resp.GetOverallCode(), err
	}
	rep := BudgetReport{Budget: r.b.budget, Streams: 1}
	if _, err := ask(0); err != nil {
		return err
	}
	time.Sleep(r.b.minDur)
	share := r.b.budget / 4
	if r.b.sequence == "large" {
		share = r.b.budget * 3 / 5
	}
	if _, err := ask(share); err != nil {
		return err
	}
	if r.b.sequence == "large" {
		code, err := ask(0)
		if err != nil {
			return err
		}
		rep.SequenceCode = code.String()
		return rep.write(out, r.o)
	}
	for range 3 {
		if _, err := ask(0); err != nil {
			return err
		}
	}
	third := time.Now()
	for time.Since(third) < r.o.duration {
		code, err := ask(0)
		if err != nil {
			return err
		}
		if code == rlsv3.RateLimitResponse_OK {
			rep.SequenceOKAfterS = time.Since(third).Seconds()
			rep.SequenceCode = code.String()
			return rep.write(out, r.o)
		}
		rep.Refused++
		time.Sleep(100 * time.Millisecond)
	}
	rep.SequenceCode = "OVER_LIMIT for all of -duration"
	return rep.write(out, r.o)
}

func (r *budgetRun) report(out io.Writer) error {
	rep := BudgetReport{Streams: r.b.streams, Skewed: r.b.skewed, Budget: r.b.budget, Charged: r.charged.Load(),
		LetThrough: float64(r.charged.Load()) / float64(r.b.budget), Admitted: r.admitted.Load(), Refused: r.refused.Load(),
		FalseRefusals: r.falseRef.Load(), Failed: r.fails.Load(), MaxGapMS: float64(r.maxGap.Load()) / 1e6,
		CheckErrors: r.checkErrs.Load(), ChargeErrors: r.chargeErrs.Load(),
		FirstRefusalMS: float64(r.firstRefusal.Load()) / 1e6, Seconds: time.Since(r.start).Seconds(),
		BlockedPerStreamS: float64(r.blocked.Load()) / 1e9 / float64(r.b.streams), LongestBlockS: float64(r.longestBlock.Load()) / 1e9,
		GaveUp: r.gaveUp.Load(), FalseGaveUp: r.falseGaveUp.Load()}
	if n := rep.Admitted + rep.Refused; n > 0 {
		rep.FalsePct = 100 * float64(rep.FalseRefusals) / float64(n)
	}
	if fs, fe := r.floodStart.Load(), r.floodEnd.Load(); fs > 0 {
		rep.FloodSeconds = float64(fe-fs) / 1e9
		rep.DuringChecks, rep.DuringFalse = r.duringChecks.Load(), r.duringFalse.Load()
		rep.AfterChecks, rep.AfterFalse = r.afterChecks.Load(), r.afterFalse.Load()
		rep.FloodRefused = r.floodRefused.Load()
	}
	return rep.write(out, r.o)
}

// write prints the report, or refuses one no check was answered in.
func (r *BudgetReport) write(out io.Writer, o *options) error {
	if r.Admitted == 0 && r.Refused == 0 && r.SequenceCode == "" {
		return fmt.Errorf("-budget: no check was answered (%d errors): is the service at %s?", r.CheckErrors, o.addr)
	}
	if o.asJSON {
		return json.NewEncoder(out).Encode(r)
	}
	if r.SequenceCode != "" {
		_, err := fmt.Fprintf(out, "budget %d, sequence: %s after %.2f s (%d refusals before)\n", r.Budget, r.SequenceCode, r.SequenceOKAfterS, r.Refused)
		return err
	}
	var b strings.Builder
	fmt.Fprintf(&b, "budget %d, %d streams (%d skewed, %d failed): charged %d = %.3fx the budget; checks admitted %d, refused %d (false %d = %.2f%% of checks; first at %.0f ms); longest admission gap %.0f ms; errors: %d checks, %d charges; %.1f s\n",
		r.Budget, r.Streams, r.Skewed, r.Failed, r.Charged, r.LetThrough, r.Admitted, r.Refused, r.FalseRefusals, r.FalsePct, r.FirstRefusalMS, r.MaxGapMS, r.CheckErrors, r.ChargeErrors, r.Seconds)
	fmt.Fprintf(&b, "falsely blocked %.3f s a stream, longest block %.3f s", r.BlockedPerStreamS, r.LongestBlockS)
	if r.GaveUp > 0 || r.FalseGaveUp > 0 {
		fmt.Fprintf(&b, "; the SDK gave up %d requests, %d of them the budget could have covered", r.GaveUp, r.FalseGaveUp)
	}
	b.WriteString("\n")
	if r.FloodSeconds > 0 {
		fmt.Fprintf(&b, "flood of %.1f s (%d of its checks refused): the others' false refusals %d of %d checks during it, %d of %d from 10 s after it\n",
			r.FloodSeconds, r.FloodRefused, r.DuringFalse, r.DuringChecks, r.AfterFalse, r.AfterChecks)
	}
	_, err := io.WriteString(out, b.String())
	return err
}

func sleepCtx(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}
