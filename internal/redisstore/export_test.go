package redisstore

// InfoField is infoField, for the package's external tests.
var InfoField = infoField

// Queued is how many calls wait for the dispatchers of a single or
// Sentinel store.
func (s *Store) Queued() int { return len(s.single.queue) }
