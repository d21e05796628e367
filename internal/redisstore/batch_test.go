package redisstore_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/internal/limit"
	"github.com/ratelimitd/ratelimitd/internal/metrics"
	"github.com/ratelimitd/ratelimitd/internal/redisstore"
	"github.com/ratelimitd/ratelimitd/internal/redistest"
)

// TestBatchIsolation sends many concurrent calls, some of which fail in
// Redis (their key holds a list: WRONGTYPE) and some of which have an
// already expired deadline or a canceled context, through the batching dispatchers: batches form
// (mean size above 1), the failures stay with their own callers, and every
// other call is decided exactly.
func TestBatchIsolation(t *testing.T) {
	srv := redistest.Start(t)
	ctx := context.Background()
	srv.Client().RPush(ctx, "wrongtype", "x")
	m := metrics.New("test")
	s, err := redisstore.New(redisstore.Options{URL: srv.URL(), Timeout: 2 * time.Second, Dispatchers: 1, Metrics: m})
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
		default:
			if err != nil || res[i][0].Over || res[i][0].Remaining != 4 {
				t.Errorf("call %d: %+v, %v; a neighbour's failure leaked", i, res[i], err)
			}
		}
	}
	fams, err := m.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() == "ratelimitd_redis_batch_size" {
			h := f.GetMetric()[0].GetHistogram()
			mean := h.GetSampleSum() / float64(h.GetSampleCount())
			if s.BreakerOpen() {
				t.Error("callers giving up opened the breaker")
			}
			t.Logf("%d pipelines for 600 calls, mean batch %.1f", h.GetSampleCount(), mean)
			if mean <= 1 {
				t.Errorf("no batching: mean batch %.1f", mean)
			}
		}
	}
}
