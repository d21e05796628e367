package global_test

import (
	"context"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/internal/global"
	"github.com/ratelimitd/ratelimitd/internal/limit"
	"github.com/ratelimitd/ratelimitd/internal/redisstore"
)

// TestCancelledCallers: callers that give up at random moments (a
// deadline of 0-3 ms, often while the region's store decides the
// request's other counter) on a request of a global and a regional
// counter. Every admission a caller saw is paid by a hit at the home, and
// no hit is paid for a request not admitted: once the instances close
// and give back what they hold, the home counts exactly the admissions.
func TestCancelledCallers(t *testing.T) {
	clock := hourClock()
	w := newWorldWith(t, 2, 2, func(i int) time.Duration { return time.Duration(10+20*i) * time.Millisecond }, 5*time.Millisecond,
		global.Options{Refresh: 50 * time.Millisecond, Now: clock}, func(o *redisstore.Options) { o.ScriptTime = clock })
	const lim = 1_000_000
	checks := []limit.Check{
		{Key: "g:cancel", Limit: lim, WindowUS: 3600e6, Hits: 1, Global: true},
		{Key: "r:cancel", Limit: 1 << 30, WindowUS: 3600e6, Hits: 1},
	}
	var admitted, cancelled atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for ri, r := range w.regions {
		for ii, g := range r.instances {
			for k := range 4 {
				rng := rand.New(rand.NewPCG(uint64(ri*10+ii), uint64(k)))
				wg.Go(func() {
					for {
						select {
						case <-stop:
							return
						default:
						}
						ctx, cancel := context.WithTimeout(context.Background(), time.Duration(rng.IntN(3000))*time.Microsecond)
						res, err := g.Evaluate(ctx, checks)
						cancel()
						switch {
						case err != nil:
							cancelled.Add(1)
						case !res[0].Over && !res[1].Over:
							admitted.Add(1)
						}
						time.Sleep(time.Duration(rng.IntN(2000)) * time.Microsecond)
					}
				})
			}
		}
	}
	time.Sleep(3 * time.Second)
	close(stop)
	wg.Wait()
	w.close()
	got := homeCount(t, w, "g:cancel")
	t.Logf("admitted %d, %d calls gave up; the home counts %d", admitted.Load(), cancelled.Load(), got)
	if cancelled.Load() == 0 {
		t.Error("no caller gave up: the test tested nothing")
	}
	if got != uint64(admitted.Load()) {
		t.Errorf("the home counts %d of the global limit spent; %d requests were admitted", got, admitted.Load())
	}
	if admitted.Load() > lim {
		t.Errorf("%d admitted of a limit of %d", admitted.Load(), lim)
	}
}
