package service_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/internal/limit"
	"github.com/ratelimitd/ratelimitd/internal/overlimitcache"
	"github.com/ratelimitd/ratelimitd/internal/redisstore"
	"github.com/ratelimitd/ratelimitd/internal/redisstore/redistest"
	"github.com/ratelimitd/ratelimitd/internal/service"
)

// TestShortStallsKeepLimiting is the hiccup once measured: 16 callers ask
// back to back about a counter already over its limit while Redis is
// stopped (SIGSTOP) for 70 ms every 400 ms, six times, with the default
// store settings. A call may be answered by policy only when its own
// round trip could not finish in its time: no call that starts 20 ms or
// more after Redis resumed is refused by an open breaker (the bug: 80.8 %
// answered by policy), and at most 2 % of those calls time out (a busy
// machine delays some round trips past the store's timeout; the breaker
// never answers for them); a fresh counter asked four times right after
// each resume gets exactly its limit (a call of it that timed out, on a
// machine too busy for the store's timeout, is answered by policy: the
// counter's own decisions never admit more than 3, and all 3 when none
// failed). With the local over-limit cache, the exhausted counter is
// never let through.
func TestShortStallsKeepLimiting(t *testing.T) {
	for _, cached := range []bool{false, true} {
		t.Run(fmt.Sprintf("cache=%v", cached), func(t *testing.T) {
			srv := redistest.Start(t)
			rs, err := redisstore.New(redisstore.Options{URL: srv.URL()})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { rs.Close() })
			var cache service.Cache
			if cached {
				cache = overlimitcache.New(1 << 20)
			}
			st := &recordingStore{Store: rs}
			s := service.New(rules(t), st, cache, service.Options{})
			if err := rs.Ping(context.Background()); err != nil {
				t.Fatal(err)
			}
			for range 3 {
				call(t, s, request(desc("user", "exhausted")))
			}
			type answer struct {
				start time.Time
				ok    bool
			}
			var mu sync.Mutex
			var answers []answer
			var stop atomic.Bool
			var wg sync.WaitGroup
			for range 16 {
				wg.Go(func() {
					for !stop.Load() {
						start := time.Now()
						r, err := s.ShouldRateLimit(context.Background(), request(desc("user", "exhausted")))
						if err != nil {
							t.Error(err)
							return
						}
						mu.Lock()
						answers = append(answers, answer{start, r.GetOverallCode().String() == "OK"})
						mu.Unlock()
						// Back to back but for a breath: answered from the
						// local cache in microseconds, 16 callers would
						// otherwise keep both cores of a small box busy
						// and starve the very calls the test times.
						time.Sleep(100 * time.Microsecond)
					}
				})
			}
			var pauses, resumes []time.Time
			freshOK := make([]int, 6)
			for i := range 6 {
				time.Sleep(330 * time.Millisecond)
				pauses = append(pauses, time.Now())
				srv.Pause()
				time.Sleep(70 * time.Millisecond)
				srv.Resume()
				resumes = append(resumes, time.Now())
				for range 4 {
					r, err := s.ShouldRateLimit(context.Background(), request(desc("user", fmt.Sprint("fresh", i))))
					if err != nil {
						t.Fatal(err)
					}
					if r.GetOverallCode().String() == "OK" {
						freshOK[i]++
					}
				}
			}
			time.Sleep(100 * time.Millisecond)
			stop.Store(true)
			wg.Wait()

			// A call may meet a stall if it started during one, or shortly
			// before (its round trip then waits on the stopped Redis until
			// the store's 50 ms timeout): only calls that started at least
			// 20 ms after a resume and more than 60 ms before the next
			// pause had a Redis able to answer them throughout.
			pauses = append(pauses, time.Now().Add(time.Hour))
			bound := 20 * time.Millisecond
			if raceEnabled {
				bound = 60 * time.Millisecond
			}
			answering := func(start time.Time) (time.Duration, bool) {
				for i, r := range resumes {
					if !start.Before(r.Add(bound)) && start.Before(pauses[i+1].Add(-60*time.Millisecond)) {
						return start.Sub(r), true
					}
				}
				return 0, false
			}
			oks, latest := 0, time.Duration(-1)
			for _, a := range answers {
				if !a.ok {
					continue
				}
				oks++
				if after, ok := answering(a.start); ok {
					latest = max(latest, after)
				}
			}
			calls, timedOut, broken := 0, 0, 0
			for _, c := range st.calls() {
				if _, ok := answering(c.start); !ok {
					continue
				}
				calls++
				switch {
				case errors.Is(c.err, redisstore.ErrBreakerOpen):
					broken++
				case c.err != nil:
					timedOut++
				}
			}
			t.Logf("%d answers for the exhausted counter, %d OK (%.1f%%); of %d store calls with Redis answering throughout, %d refused by the breaker, %d failed (latest OK to such a call started %v after a resume); fresh counter OK per stall %v (limit 3 of 4)",
				len(answers), oks, 100*float64(oks)/float64(max(len(answers), 1)), calls, broken, timedOut, latest, freshOK)
			if cached && oks > 0 {
				t.Errorf("with the local cache, %d OK answers for an exhausted counter", oks)
			}
			if broken > 0 {
				t.Errorf("%d store calls started %v or more after Redis resumed were refused by an open breaker", broken, bound)
			}
			if !cached && (calls == 0 || timedOut*50 > calls) {
				t.Errorf("%d of %d store calls with Redis answering throughout failed: more than 2%%", timedOut, calls)
			}
			freshFailed := make([]int, 6)
			for _, c := range st.calls() {
				// A breaker open is no busy machine's doing: not excused.
				if _, stall, ok := strings.Cut(c.key, "fresh"); ok && c.err != nil && !errors.Is(c.err, redisstore.ErrBreakerOpen) && stall != "" {
					freshFailed[stall[0]-'0']++
				}
			}
			for i, n := range freshOK {
				// Each failed call was answered OK by policy.
				if decided := n - freshFailed[i]; decided > 3 || freshFailed[i] == 0 && n != 3 {
					t.Errorf("stall %d: the fresh counter got %d of 4 right after the resume (%d by policy, the store failing), want its limit 3", i, n, freshFailed[i])
				}
			}
		})
	}
}

// recordingStore records each Evaluate's start and error.
type recordingStore struct {
	service.Store
	mu  sync.Mutex
	log []storeCall
}

type storeCall struct {
	start time.Time
	err   error
	key   string // the first check's
}

func (r *recordingStore) Evaluate(ctx context.Context, checks []limit.Check) ([]limit.Result, error) {
	start := time.Now()
	res, err := r.Store.Evaluate(ctx, checks)
	r.mu.Lock()
	key := ""
	if len(checks) > 0 {
		key = checks[0].Key
	}
	r.log = append(r.log, storeCall{start, err, key})
	r.mu.Unlock()
	return res, err
}

func (r *recordingStore) calls() []storeCall {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.log)
}
