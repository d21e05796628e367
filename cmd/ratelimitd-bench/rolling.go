package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/redis/go-redis/v9"
)

// rollingOptions are a rolling update's: envoyproxy/ratelimit's pods and
// ratelimitd's side by side on one Redis, the traffic moving from the
// first to the second.
type rollingOptions struct {
	limit  int64         // the rule's requests per minute
	shift  time.Duration // how long the traffic takes to move over (0: at once)
	at     time.Duration // when the move starts
	prefix string        // CACHE_KEY_PREFIX
}

func rollingFlags(fs *flag.FlagSet, r *rollingOptions, on *bool) {
	fs.BoolVar(on, "rolling", false, "a rolling update from envoyproxy/ratelimit: offer -rate on one key of domain rolling (user=u, -rolling-limit a minute), each request to an emulated incumbent pod (INCRBY and EXPIRE of its key in -redis, as it writes them) or to -addr, the share of -addr growing from 0 to 1 over -rolling-shift from -rolling-at; report what both admit in each minute")
	fs.Int64Var(&r.limit, "rolling-limit", 6000, "-rolling: the rule's requests per minute")
	fs.DurationVar(&r.shift, "rolling-shift", time.Minute, "-rolling: how long the traffic takes to move over (0: at once)")
	fs.DurationVar(&r.at, "rolling-at", 30*time.Second, "-rolling: when the move starts, from the run's start (5 s into a minute)")
	fs.StringVar(&r.prefix, "rolling-prefix", "", "-rolling: the incumbent's CACHE_KEY_PREFIX (ratelimitd's --key-prefix)")
}

// rollingWindow is what one minute admitted, by side.
type rollingWindow struct{ incumbent, ratelimitd, offered atomic.Int64 }

func runRolling(ctx context.Context, o *options, r *rollingOptions, client rlsv3.RateLimitServiceClient, out io.Writer) error {
	if o.redisAddr == "" || o.rate <= 0 {
		return errors.New("-rolling needs -redis (the Redis both share) and -rate")
	}
	rdb := redis.NewClient(&redis.Options{Addr: o.redisAddr})
	defer rdb.Close()
	var mu sync.Mutex
	windows := map[int64]*rollingWindow{}
	window := func(t time.Time) *rollingWindow {
		mu.Lock()
		defer mu.Unlock()
		w := windows[t.Unix()/60]
		if w == nil {
			w = &rollingWindow{}
			windows[t.Unix()/60] = w
		}
		return w
	}
	// Start 5 s into a minute, so that the windows fall the same way in
	// every run (-rolling-at 20s moves the traffic mid-window).
	first := time.Now().Truncate(time.Minute).Add(time.Minute + 5*time.Second)
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(time.Until(first)):
	}
	start := time.Now()
	share := func(t time.Time) float64 {
		e := t.Sub(start) - r.at
		switch {
		case e < 0:
			return 0
		case e >= r.shift:
			return 1
		}
		return float64(e) / float64(r.shift)
	}
	var next, errs atomic.Int64
	interval := time.Duration(float64(time.Second) / o.rate)
	ctx, cancel := context.WithTimeout(ctx, o.duration)
	defer cancel()
	var wg sync.WaitGroup
	for range max(o.workers, 1) {
		wg.Go(func() {
			for {
				at := start.Add(time.Duration(next.Add(1)-1) * interval)
				select {
				case <-ctx.Done():
					return
				case <-time.After(time.Until(at)):
				}
				w := window(at)
				w.offered.Add(1)
				admitted, err := rollingCall(ctx, r, rdb, client, at, rand.Float64() >= share(at))
				switch {
				case err != nil:
					errs.Add(1)
				case admitted == sideIncumbent:
					w.incumbent.Add(1)
				case admitted == sideRatelimitd:
					w.ratelimitd.Add(1)
				}
			}
		})
	}
	wg.Wait()
	reportRolling(out, r, o, start, windows)
	fmt.Fprintf(out, "errors: %d\n", errs.Load())
	return nil
}

// The side that admitted a request of the rolling update, if any.
const (
	sideNone = iota
	sideIncumbent
	sideRatelimitd
)

// rollingCall sends one request of the rolling update sent at at: to an
// emulated incumbent pod (the commands its reference shows for a hit,
// INCRBY and EXPIRE of its key, pipelined; over when the count passes the
// limit) or to ratelimitd. It returns the side that admitted it.
func rollingCall(ctx context.Context, r *rollingOptions, rdb *redis.Client, client rlsv3.RateLimitServiceClient, at time.Time, incumbent bool) (int, error) {
	if incumbent {
		key := fmt.Sprintf("%srolling_user_u_%d", r.prefix, at.Unix()/60*60)
		var incr *redis.IntCmd
		_, err := rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
			incr = p.IncrBy(ctx, key, 1)
			p.Expire(ctx, key, time.Minute)
			return nil
		})
		if err != nil || incr.Val() > r.limit {
			return sideNone, err
		}
		return sideIncumbent, nil
	}
	resp, err := client.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "rolling",
		Descriptors: []*rlcommon.RateLimitDescriptor{{Entries: []*rlcommon.RateLimitDescriptor_Entry{{Key: "user", Value: "u"}}}}})
	if err != nil || resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
		return sideNone, err
	}
	return sideRatelimitd, nil
}

// reportRolling prints what each minute admitted, by side.
func reportRolling(out io.Writer, r *rollingOptions, o *options, start time.Time, windows map[int64]*rollingWindow) {
	var mins []int64
	for m := range windows {
		mins = append(mins, m)
	}
	sort.Slice(mins, func(i, j int) bool { return mins[i] < mins[j] })
	for _, m := range mins {
		w := windows[m]
		full := m*60 >= start.Unix() && (m+1)*60 <= start.Add(o.duration).Unix()
		tag := "partial"
		if full {
			tag = "full"
		}
		inc, rl := w.incumbent.Load(), w.ratelimitd.Load()
		fmt.Fprintf(out, "minute %s (%s): offered %d, admitted %d = %.3fx the limit (incumbent %d, ratelimitd %d)\n",
			time.Unix(m*60, 0).UTC().Format("15:04"), tag, w.offered.Load(), inc+rl, float64(inc+rl)/float64(r.limit), inc, rl)
	}
}
