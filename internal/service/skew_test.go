package service_test

import (
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/internal/overlimitcache"
	"github.com/ratelimitd/ratelimitd/internal/redisstore"
	"github.com/ratelimitd/ratelimitd/internal/redisstore/redistest"
	"github.com/ratelimitd/ratelimitd/internal/service"
)

// TestClockSkew runs two instances on one Redis whose own clocks differ
// by 70 s (the article's Laravel lab let 600 through a limit of 100 this
// way), alternating 40 requests on a 5-a-minute rule. As deployed, windows
// come from Redis TIME: together they admit exactly the limit and report
// the same reset. The control gives each instance's clock to its store as
// the script's time, as a limiter deciding on app-server time would: the
// instances then sit in different minutes, each resets the other's
// window, and far more than the limit goes through — so this test fails
// on any path by which an instance's own clock reaches the decision.
func TestClockSkew(t *testing.T) {
	srv := redistest.Start(t)
	run := func(t *testing.T, appTimeInScript bool) (ok int, resets [2]int64) {
		now, err := srv.Client().Time(t.Context()).Result()
		if err != nil {
			t.Fatal(err)
		}
		if left := now.Truncate(time.Minute).Add(time.Minute).Sub(now); left < 15*time.Second {
			time.Sleep(left + time.Second) // 40 requests in one minute window
		}
		newInstance := func(skew time.Duration) *service.Service {
			clock := func() time.Time { return time.Now().Add(skew) }
			opts := redisstore.Options{URL: srv.URL(), Timeout: time.Second}
			if appTimeInScript {
				opts.ScriptTime = clock
			}
			st, err := redisstore.New(opts)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { st.Close() })
			return service.New(rules(t), st, overlimitcache.New(1<<20), service.Options{Now: clock})
		}
		a, b := newInstance(0), newInstance(70*time.Second)
		for i := range 40 {
			s := a
			if i%2 == 1 {
				s = b
			}
			r := call(t, s, request(desc("login", appTimeName(appTimeInScript))))
			if codes(r) == "OK OK" {
				ok++
			}
			resets[i%2] = r.GetStatuses()[0].GetDurationUntilReset().GetSeconds()
		}
		return ok, resets
	}
	t.Run("redis time", func(t *testing.T) {
		ok, resets := run(t, false)
		if ok != 5 {
			t.Errorf("two skewed instances admitted %d, want exactly the limit 5", ok)
		}
		if d := resets[0] - resets[1]; d < -1 || d > 1 {
			t.Errorf("resets differ: %d s vs %d s", resets[0], resets[1])
		}
	})
	t.Run("control: app time", func(t *testing.T) {
		if ok, _ := run(t, true); ok <= 5 {
			t.Errorf("deciding on the instances' own skewed clocks admitted %d, want more than the limit 5: the test cannot see skew", ok)
		}
	})
}

func appTimeName(b bool) string {
	if b {
		return "app-time"
	}
	return "redis-time"
}
