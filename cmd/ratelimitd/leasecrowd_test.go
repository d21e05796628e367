package main

import (
	"context"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/ratelimitd/ratelimitd/internal/redisstore/redistest"
	"github.com/ratelimitd/ratelimitd/internal/starve"
)

// TestLeaseUseWhenCrowded: three instances with the default flags share
// a leased counter of 300 a second, offered four times that (paced) on a
// machine kept busy by two loops a core: every window admits at least
// 97 % of its limit (291), or of what was asked when a machine more
// crowded still sent less than the limit. Hits drawn into a grant and not used before
// the window ends are lost to every instance; a starved instance must
// still spend what it draws. (That no window admits more than its limit
// is TestLeasePausedHolders', under pauses too.) A call is put in the
// window of its decision (decisionEnds); one that may be in either of
// two (answered late across a window's end) counts as asked in neither
// and as admitted in both: the test fails only on a window it is sure
// of, however late a crowded machine answers.
func TestLeaseUseWhenCrowded(t *testing.T) {
	srv := redistest.Start(t)
	const lim, windows = 300, 4
	rules := writeRules(t, fmt.Sprintf(`domain: crowd
descriptors:
  - key: k
    rate_limit: {unit: second, requests_per_unit: %d, lease: true}
`, lim))
	starve.Loops(t, 2*runtime.NumCPU())
	var clients []rlsv3.RateLimitServiceClient
	for range 3 {
		in := start(t, env(nil), "--config", rules, "--redis-url", srv.URL(), "--decision-metadata")
		clients = append(clients, rlsv3.NewRateLimitServiceClient(dial(t, in.grpcAddr)))
	}
	time.Sleep(time.Until(time.Now().Truncate(time.Second).Add(time.Second)))
	first := time.Now().Unix() + 1
	end := time.Now().Add((windows + 1) * time.Second)
	var mu sync.Mutex
	admitted, asked, failed := map[int64]int{}, map[int64]int{}, 0
	var wg sync.WaitGroup
	const callers = 8
	every := time.Second * time.Duration(len(clients)*callers) / (4 * lim)
	for _, c := range clients {
		for range callers {
			wg.Go(func() {
				next := time.Now()
				for time.Now().Before(end) {
					ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
					sent := time.Now().UnixMicro()
					r, err := c.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "crowd", Descriptors: []*rlcommon.RateLimitDescriptor{desc("k", "v")}})
					got := time.Now().UnixMicro()
					cancel()
					var ends []int64
					if err == nil {
						ds, _ := r.GetDynamicMetadata().AsMap()["decisions"].([]any)
						d, _ := ds[0].(map[string]any)
						reset, _ := d["reset_us"].(float64)
						ends = decisionEnds(sent, got, reset)
					}
					mu.Lock()
					if len(ends) == 1 {
						asked[ends[0]/1e6-1]++
					}
					for _, end := range ends {
						if r.GetOverallCode() == rlsv3.RateLimitResponse_OK {
							admitted[end/1e6-1]++
						}
					}
					if err != nil {
						failed++
					}
					mu.Unlock()
					next = later(next.Add(every), time.Now())
					time.Sleep(time.Until(next))
				}
			})
		}
	}
	wg.Wait()
	var got []string
	for w := first; w < first+windows; w++ {
		got = append(got, fmt.Sprintf("%d of %d", admitted[w], asked[w]))
		// A machine crowded past two loops a core (the suite under
		// STARVE=4 beside) may send less than the limit: then 97 % of
		// what was asked.
		if due := min(lim, asked[w]); admitted[w] < due*97/100 {
			t.Errorf("window %d admitted %d of %d asked: under 97 %% of the %d due", w-first, admitted[w], asked[w], due)
		}
	}
	t.Logf("admitted per window: %s; %d calls failed", strings.Join(got, ", "), failed)
}
