// Package overlimitcache remembers counters known to be over their limit,
// so that repeated requests for them are answered locally, without a store
// call, until the counter's window resets.
package overlimitcache

import (
	"encoding/binary"
	"time"

	"github.com/coocood/freecache"
)

// Cache is a fixed-size freecache of counter keys to the local time they
// stop being blocked and the limit they were found exhausted under. A nil
// *Cache (size 0) holds nothing. It is safe for concurrent use.
type Cache struct {
	fc *freecache.Cache
}

// New returns a cache of about size bytes, or nil when size is 0 (off).
// freecache raises sizes below 512 KiB to 512 KiB.
func New(size int) *Cache {
	if size <= 0 {
		return nil
	}
	return &Cache{fc: freecache.NewCache(size)}
}

// Blocked reports whether key is known exhausted under limit at now, and
// until when. An entry recorded under another limit does not block: a
// request-supplied limit override, or a rule changed since, may allow more.
func (c *Cache) Blocked(key string, limit uint64, now time.Time) (time.Time, bool) {
	if c == nil {
		return time.Time{}, false
	}
	var buf [16]byte
	v, err := c.fc.GetWithBuf([]byte(key), buf[:])
	if err != nil || len(v) != 16 || binary.BigEndian.Uint64(v[8:]) != limit {
		return time.Time{}, false
	}
	until := time.Unix(0, int64(binary.BigEndian.Uint64(v)))
	if !now.Before(until) {
		return time.Time{}, false
	}
	return until, true
}

// Block marks key exhausted under limit until until. The entry's own
// expiry is rounded up to whole seconds (freecache's unit); Blocked
// compares against the exact time stored in the value.
func (c *Cache) Block(key string, limit uint64, until, now time.Time) {
	if c == nil || !until.After(now) {
		return
	}
	var v [16]byte
	binary.BigEndian.PutUint64(v[:8], uint64(until.UnixNano()))
	binary.BigEndian.PutUint64(v[8:], limit)
	secs := int((until.Sub(now) + time.Second - 1) / time.Second)
	_ = c.fc.Set([]byte(key), v[:], secs) // a full cache only evicts older entries
}

// Forget drops key, e.g. after a refund made room under its limit.
func (c *Cache) Forget(key string) {
	if c != nil {
		c.fc.Del([]byte(key))
	}
}

// Clear empties the cache; a rules change makes every entry suspect.
func (c *Cache) Clear() {
	if c != nil {
		c.fc.Clear()
	}
}

// Len returns the number of entries, expired ones included until freecache
// drops them.
func (c *Cache) Len() int64 {
	if c == nil {
		return 0
	}
	return c.fc.EntryCount()
}
