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
		c.Block("k", 10, now.Add(1500*time.Millisecond), now)
		if _, ok := c.Blocked("k", 10, time.Now()); !ok {
			t.Fatal("not blocked right after Block")
		}
		time.Sleep(1499 * time.Millisecond)
		if _, ok := c.Blocked("k", 10, time.Now()); !ok {
			t.Fatal("unblocked before the reset")
		}
		time.Sleep(time.Millisecond)
		if _, ok := c.Blocked("k", 10, time.Now()); ok {
			t.Fatal("still blocked at the reset")
		}
	})
}

func TestOtherLimitNotBlocked(t *testing.T) {
	c := New(1 << 20)
	now := time.Now()
	c.Block("k", 5, now.Add(time.Minute), now)
	if _, ok := c.Blocked("k", 50, now); ok {
		t.Error("a block under limit 5 blocked a request under limit 50")
	}
	if until, ok := c.Blocked("k", 5, now); !ok || !until.Equal(now.Add(time.Minute)) {
		t.Errorf("Blocked = %v, %v", until, ok)
	}
}

func TestForgetClearAndOff(t *testing.T) {
	c := New(1 << 20)
	now := time.Now()
	c.Block("a", 1, now.Add(time.Minute), now)
	c.Block("b", 1, now.Add(time.Minute), now)
	c.Forget("a")
	if _, ok := c.Blocked("a", 1, now); ok {
		t.Error("a still blocked after Forget")
	}
	c.Clear()
	if _, ok := c.Blocked("b", 1, now); ok {
		t.Error("b still blocked after Clear")
	}
	var off *Cache = New(0)
	off.Block("x", 1, now.Add(time.Minute), now)
	if _, ok := off.Blocked("x", 1, now); ok {
		t.Error("a size-0 cache blocked")
	}
	if off.Len() != 0 {
		t.Error("a size-0 cache has entries")
	}
}
