package redisstore

import (
	"context"

	"github.com/redis/go-redis/v9"
)

// InfoField is infoField, for the package's external tests.
var InfoField = infoField

// Queued is how many calls wait for the dispatchers of a single or
// Sentinel store.
func (s *Store) Queued() int { return len(s.single.queue) }

// BarrierAcked runs a Cluster journal round's part on master m (its
// barrier written) and reports whether a replica acknowledged it.
func BarrierAcked(ctx context.Context, m *redis.Client) (bool, error) {
	r, err := masterRoundOn(ctx, m, true)
	return r.acked, err
}
