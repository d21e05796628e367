package redisstore

import (
	"context"
	"testing"
	"time"
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
