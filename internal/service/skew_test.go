package service_test

import (
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/internal/overlimitcache"
	"github.com/ratelimitd/ratelimitd/internal/redisstore"
	"github.com/ratelimitd/ratelimitd/internal/redistest"
	"github.com/ratelimitd/ratelimitd/internal/service"
)

// TestClockSkew runs two instances on one Redis whose own clocks differ
// by 70 s (the article's Laravel lab let 600 through a limit of 100 this
// way): windows come from Redis TIME, so together they admit exactly the
// limit, and report the same reset.
func TestClockSkew(t *testing.T) {
	srv := redistest.Start(t)
	now, err := srv.Client().Time(t.Context()).Result()
	if err != nil {
		t.Fatal(err)
	}
	if left := now.Truncate(time.Hour).Add(time.Hour).Sub(now); left < 10*time.Second {
		time.Sleep(left + time.Second) // stay in one hour window
	}
	newInstance := func(skew time.Duration) *service.Service {
		st, err := redisstore.New(redisstore.Options{URL: srv.URL(), Timeout: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { st.Close() })
		return service.New(rules(t), st, overlimitcache.New(1<<20), service.Options{
			Now: func() time.Time { return time.Now().Add(skew) },
		})
	}
	a, b := newInstance(0), newInstance(70*time.Second)
	ok := 0
	var resets [2]int64
	for i := range 40 {
		s := a
		if i%2 == 1 {
			s = b
		}
		r := call(t, s, request(desc("user", "skew"), desc("ip", "skew")))
		if codes(r) == "OK OK OK" {
			ok++
		}
		resets[i%2] = r.GetStatuses()[1].GetDurationUntilReset().GetSeconds()
	}
	if ok != 3 {
		t.Errorf("two skewed instances admitted %d, want exactly the limit 3", ok)
	}
	if d := resets[0] - resets[1]; d < -1 || d > 1 {
		t.Errorf("resets differ: %d s vs %d s", resets[0], resets[1])
	}
}
