package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
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
// charge of its tokens (apply_on_stream_done) whose answer is ignored.
type budgetOptions struct {
	budget         uint64 // the rule's requests_per_unit (deploy/bench/rules.yaml)
	key            string // the rule's descriptor key
	streams        int
	minTok, maxTok uint64
	minDur, maxDur time.Duration
	skewed         int // streams 20 times longer and larger
	retry          time.Duration
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
	CheckErrors    int64   `json:"check_errors"`
	ChargeErrors   int64   `json:"charge_errors"`
	FirstRefusalMS float64 `json:"first_refusal_ms"`
	Seconds        float64 `json:"seconds"`
}

// runBudget runs the streams for o.duration on a fresh counter and waits
// for the streams in flight to charge. A refusal is false when the
// budget, with every admitted stream's tokens charged (the bench knows
// them; the service only estimates), would still have covered the
// refused stream.
// valid reports whether the options make a budget run.
func (b *budgetOptions) valid() bool {
	return b.streams >= 1 && b.minTok >= 1 && b.maxTok >= b.minTok && b.maxDur >= b.minDur && b.skewed <= b.streams
}

func runBudget(ctx context.Context, o *options, b *budgetOptions, clients []rlsv3.RateLimitServiceClient, out io.Writer) error {
	value := fmt.Sprintf("run-%d", time.Now().UnixNano())
	req := func(hits uint64) *rlsv3.RateLimitRequest {
		return &rlsv3.RateLimitRequest{Domain: o.domain, Descriptors: []*rlcommon.RateLimitDescriptor{{
			Entries:    []*rlcommon.RateLimitDescriptor_Entry{{Key: b.key, Value: value}},
			HitsAddend: wrapperspb.UInt64(hits),
		}}}
	}
	var charged, inflight atomic.Uint64
	var admitted, refused, falseRef, checkErrs, chargeErrs, firstRefusal atomic.Int64
	start := time.Now()
	lctx, cancel := context.WithTimeout(ctx, o.duration)
	defer cancel()
	var wg sync.WaitGroup
	for i := range b.streams {
		rng := rand.New(rand.NewPCG(uint64(i), uint64(start.UnixNano())))
		scale := uint64(1)
		if i < b.skewed {
			scale = 20
		}
		cl := clients[i%len(clients)]
		wg.Go(func() {
			for lctx.Err() == nil {
				size := scale * (b.minTok + rng.Uint64N(b.maxTok-b.minTok+1))
				dur := time.Duration(scale) * (b.minDur + time.Duration(rng.Int64N(int64(b.maxDur-b.minDur)+1)))
				resp, err := cl.ShouldRateLimit(lctx, req(0))
				if err != nil {
					if lctx.Err() == nil {
						checkErrs.Add(1)
						sleepCtx(lctx, b.retry)
					}
					continue
				}
				if resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
					refused.Add(1)
					firstRefusal.CompareAndSwap(0, int64(time.Since(start)))
					if charged.Load()+inflight.Load()+size <= b.budget {
						falseRef.Add(1)
					}
					sleepCtx(lctx, b.retry)
					continue
				}
				admitted.Add(1)
				inflight.Add(size)
				time.Sleep(dur) // a stream admitted runs to its end
				// Envoy charges at stream end whatever the load test's clock says.
				cctx, ccancel := context.WithTimeout(context.Background(), 5*time.Second)
				if _, err := cl.ShouldRateLimit(cctx, req(size)); err != nil {
					chargeErrs.Add(1)
				}
				ccancel()
				charged.Add(size)
				inflight.Add(^(size - 1))
			}
		})
	}
	wg.Wait()
	r := BudgetReport{Streams: b.streams, Skewed: b.skewed, Budget: b.budget, Charged: charged.Load(),
		LetThrough: float64(charged.Load()) / float64(b.budget), Admitted: admitted.Load(), Refused: refused.Load(),
		FalseRefusals: falseRef.Load(), CheckErrors: checkErrs.Load(), ChargeErrors: chargeErrs.Load(),
		FirstRefusalMS: float64(firstRefusal.Load()) / 1e6, Seconds: time.Since(start).Seconds()}
	return r.write(out, o)
}

// write prints the report, or refuses one no check was answered in.
func (r *BudgetReport) write(out io.Writer, o *options) error {
	if r.Admitted == 0 && r.Refused == 0 {
		return fmt.Errorf("-budget: no check was answered (%d errors): is the service at %s?", r.CheckErrors, o.addr)
	}
	if o.asJSON {
		return json.NewEncoder(out).Encode(r)
	}
	_, err := fmt.Fprintf(out, "budget %d, %d streams (%d skewed): charged %d = %.3fx the budget; checks admitted %d, refused %d (false %d; first at %.0f ms); errors: %d checks, %d charges; %.1f s\n",
		r.Budget, r.Streams, r.Skewed, r.Charged, r.LetThrough, r.Admitted, r.Refused, r.FalseRefusals, r.FirstRefusalMS, r.CheckErrors, r.ChargeErrors, r.Seconds)
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
