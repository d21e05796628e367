package redisstore

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/internal/limit"
	"github.com/ratelimitd/ratelimitd/internal/redisstore/redistest"
)

// TestCallAnsweredOnce: a call's deadline and its dispatcher may both
// answer it; the first answer stands, and the second neither replaces it
// nor blocks its sender (a blocked dispatcher would stall every call
// behind it).
func TestCallAnsweredOnce(t *testing.T) {
	c := calls.Get().(*call)
	c.finish(nil, 0, context.DeadlineExceeded)
	sent := make(chan struct{})
	go func() {
		c.finish([]any{int64(0), int64(1), int64(2)}, 3, nil)
		close(sent)
	}()
	select {
	case <-sent:
	case <-time.After(5 * time.Second):
		t.Fatal("the second answer blocked its sender")
	}
	<-c.done
	if c.err != context.DeadlineExceeded || c.res != nil || c.batch != 0 {
		t.Errorf("answer = %v, %v, %d; want the first (deadline exceeded)", c.res, c.err, c.batch)
	}
	select {
	case <-c.done:
		t.Error("a second signal was sent")
	default:
	}
}

// TestQueuedCallPastItsStoreDeadlineNotSent: a call whose store deadline
// (--redis-timeout) passed while it waited for its dispatcher, its
// caller's own context still running, is answered with the deadline's
// error and not sent: its caller was answered by the failure policy, and
// its hits must not be consumed after. A call in the same batch within
// its deadline is sent.
func TestQueuedCallPastItsStoreDeadlineNotSent(t *testing.T) {
	s, err := New(Options{URL: redistest.Start(t).URL(), Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	check := func(key string, hits uint64) []limit.Check {
		return []limit.Check{{Key: key, Limit: 1000, WindowUS: 3600e6, Hits: hits}}
	}
	late, live := calls.Get().(*call), calls.Get().(*call)
	late.ctx, late.deadline, late.checks = context.Background(), time.Now().Add(-time.Millisecond), check("late", 1)
	live.ctx, live.deadline, live.checks = context.Background(), time.Now().Add(time.Second), check("live", 1)
	s.send(s.single, []*call{late, live})
	<-late.done
	<-live.done
	if !errors.Is(late.err, context.DeadlineExceeded) {
		t.Errorf("the call past its deadline: %v, want the deadline's error", late.err)
	}
	if live.err != nil {
		t.Errorf("the call within its deadline: %v", live.err)
	}
	res, err := s.Evaluate(context.Background(), append(check("late", 0), check("live", 0)...))
	if err != nil {
		t.Fatal(err)
	}
	if res[0].Remaining != 1000 || res[1].Remaining != 999 {
		t.Errorf("left: late %d, live %d; want 1000 (never sent) and 999", res[0].Remaining, res[1].Remaining)
	}
}
