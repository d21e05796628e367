package overlimitcache

import (
	"testing"
	"testing/synctest"
	"time"
)

func TestBlockUntilReset(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := New(1 << 20)
		now := time.Now()
		c.Block("k", now.Add(1500*time.Millisecond), now)
		if _, ok := c.Blocked("k", time.Now()); !ok {
			t.Fatal("not blocked right after Block")
		}
		time.Sleep(1499 * time.Millisecond)
		if _, ok := c.Blocked("k", time.Now()); !ok {
			t.Fatal("unblocked before the reset")
		}
		time.Sleep(time.Millisecond)
		if _, ok := c.Blocked("k", time.Now()); ok {
			t.Fatal("still blocked at the reset")
		}
	})
}

func TestForgetClearAndOff(t *testing.T) {
	c := New(1 << 20)
	now := time.Now()
	c.Block("a", now.Add(time.Minute), now)
	c.Block("b", now.Add(time.Minute), now)
	c.Forget("a")
	if _, ok := c.Blocked("a", now); ok {
		t.Error("a still blocked after Forget")
	}
	c.Clear()
	if _, ok := c.Blocked("b", now); ok {
		t.Error("b still blocked after Clear")
	}
	var off *Cache = New(0)
	off.Block("x", now.Add(time.Minute), now)
	if _, ok := off.Blocked("x", now); ok {
		t.Error("a size-0 cache blocked")
	}
}
