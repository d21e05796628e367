package redisstore_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/ratelimitd/ratelimitd/internal/limit"
	"github.com/ratelimitd/ratelimitd/internal/redisstore"
	"github.com/ratelimitd/ratelimitd/internal/redisstore/redistest"
)

// TestBatchIsolation sends many concurrent calls through the batching
// dispatchers: some fail in Redis (their key is one the ACL user may not
// touch: NOPERM, which also fails the script's MGET of the whole batch),
// some have an already expired deadline or a canceled context, some use a
// key that holds a list (healed: read as absent, overwritten). Batches
// form (mean size above 1), the failures stay with their own callers, and
// every other call is decided exactly.
func TestBatchIsolation(t *testing.T) {
	srv := redistest.Start(t)
	ctx := context.Background()
	admin := srv.Client()
	admin.RPush(ctx, "wrongtype", "x")
	if err := admin.Do(ctx, "ACL", "SETUSER", "rl", "on", ">pw", "~ok*", "~wrongtype", "+@all").Err(); err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	m := redisstore.NewMetrics(reg)
	s, err := redisstore.New(redisstore.Options{URL: "redis://rl:pw@" + srv.Addr(), Timeout: 2 * time.Second, Dispatchers: 1, Metrics: m})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var wg sync.WaitGroup
	errs := make([]error, 600)
	res := make([][]limit.Result, 600)
	for i := range errs {
		wg.Go(func() {
			key := fmt.Sprint("ok", i)
			cctx := ctx
			switch i % 10 {
			case 3:
				key = "denied"
			case 5:
				key = "wrongtype"
			case 7:
				var cancel context.CancelFunc
				cctx, cancel = context.WithTimeout(ctx, time.Nanosecond)
				defer cancel()
			case 9:
				var cancel context.CancelFunc
				cctx, cancel = context.WithCancel(ctx)
				cancel()
			}
			res[i], errs[i] = s.Evaluate(cctx, []limit.Check{{Key: key, Limit: 5, WindowUS: 3600e6, Hits: 1}})
		})
	}
	wg.Wait()
	for i, err := range errs {
		switch i % 10 {
		case 3, 7, 9:
			if err == nil {
				t.Errorf("call %d should have failed", i)
			}
		case 5:
			if err != nil {
				t.Errorf("call %d on a key of another type: %v, want it healed", i, err)
			}
		default:
			if err != nil || res[i][0].Over || res[i][0].Remaining != 4 {
				t.Errorf("call %d: %+v, %v; a neighbour's failure leaked", i, res[i], err)
			}
		}
	}
	if typ := admin.Type(ctx, "wrongtype").Val(); typ != "string" || admin.PTTL(ctx, "wrongtype").Val() <= 0 {
		t.Errorf("key of another type: now %s with TTL %v, want a counter with a TTL", typ, admin.PTTL(ctx, "wrongtype").Val())
	}
	if n := admin.Get(ctx, "wrongtype").Val(); n == "" {
		t.Error("healed key empty")
	}
	if s.BreakerOpen() {
		t.Error("callers giving up opened the breaker")
	}
	var batches *dto.Histogram
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() == "ratelimitd_redis_batch_size" && len(f.GetMetric()) == 1 {
			batches = f.GetMetric()[0].GetHistogram()
		}
	}
	if batches == nil || batches.GetSampleCount() == 0 {
		t.Fatal("no ratelimitd_redis_batch_size recorded")
	}
	mean := batches.GetSampleSum() / float64(batches.GetSampleCount())
	t.Logf("%d pipelines for 600 calls, mean batch %.1f", batches.GetSampleCount(), mean)
	if mean <= 1 {
		t.Errorf("no batching: mean batch %.1f", mean)
	}
}
