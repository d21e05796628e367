package redisstore

import (
	"context"
	"time"

	"github.com/redis/go-redis/v9"
)

// watchPolicy reads maxmemory-policy now and every interval until Close.
// Anything but noeviction can evict live counters — and since every key
// here carries a TTL, the volatile-* policies evict them too — which
// resets a client's limit.
func (s *Store) watchPolicy(every time.Duration) {
	s.repeat(0, every, func() bool {
		s.checkPolicy()
		return false
	})
}

// repeat runs f after first, then every interval, until f reports it is
// done or the store closes.
func (s *Store) repeat(first, every time.Duration, f func() (done bool)) {
	t := time.NewTimer(first)
	defer t.Stop()
	for {
		select {
		case <-s.done:
			return
		case <-t.C:
		}
		if f() {
			return
		}
		t.Reset(every)
	}
}

func (s *Store) checkPolicy() {
	ctx, cancel := context.WithTimeout(context.Background(), max(4*s.timeout, time.Second))
	defer cancel()
	read := func(ctx context.Context, c *redis.Client) error {
		node := c.Options().Addr
		vals, err := c.ConfigGet(ctx, "maxmemory-policy").Result()
		if err != nil {
			return err
		}
		s.notePolicy(node, vals["maxmemory-policy"])
		return nil
	}
	var err error
	switch {
	case s.cluster != nil:
		err = s.cluster.ForEachMaster(ctx, read)
	default:
		if c, ok := s.client.(*redis.Client); ok {
			err = read(ctx, c)
		}
	}
	if err != nil {
		s.log.Debug("could not read maxmemory-policy", "err", err)
	}
}

// notePolicy records node's policy and warns once per change to an
// evicting one.
func (s *Store) notePolicy(node, policy string) {
	if policy == "" {
		policy = "unknown"
	}
	s.m.SetMaxmemoryPolicy(node, policy)
	prev, _ := s.policies.Swap(node, policy)
	if prev == policy {
		return
	}
	if policy != "noeviction" && policy != "unknown" {
		s.log.Warn("redis maxmemory-policy can evict rate-limit counters, resetting limits; use noeviction on the limiter's Redis",
			"node", node, "maxmemory-policy", policy)
	}
}
