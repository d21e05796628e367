package redisstore

import (
	"crypto/rand"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/ratelimitd/ratelimitd/internal/limit"
)

// marker gives each charge the journal keeps a mark (limit.Check.MarkKey
// and MarkOff): one bit of a marks key kept beside the counter, per
// counter, process and window, which decide.lua sets when it records the
// charge and finds set when the charge comes again. So the journal can
// send a charge again whose call went unanswered, and re-apply every
// charge no replica acknowledged after the master changed, and each
// counts once: 1 bit a charge, gone a window and a grace after the
// counter's last charge of this process.
type marker struct {
	id string // this process's: no two share a marks key
	mu sync.Mutex
	// next is, per counter key, the window (by this clock: it only names
	// the marks key) and the next bit to give.
	next  map[string]markSeq
	swept int // len(next) after the last sweep
}

type markSeq struct {
	w, gen int64 // the window's length, and its number
	off    uint64
}

func newMarker() *marker {
	return &marker{id: rand.Text()[:12], next: map[string]markSeq{}}
}

// marked returns checks with a mark on each journaled charge (a copy: the
// caller's slice is not written), or checks itself when none is.
func (m *marker) marked(checks []limit.Check, now time.Time) []limit.Check {
	out, copied := checks, false
	m.mu.Lock()
	defer m.mu.Unlock()
	for i := range checks {
		c := &checks[i]
		if !journaled(*c) || c.WindowUS <= 0 || c.MarkKey != "" {
			continue
		}
		if !copied {
			out, copied = slices.Clone(checks), true
		}
		gen := now.UnixMicro() / c.WindowUS
		s := m.next[c.Key]
		if s.gen != gen || s.w != c.WindowUS {
			s = markSeq{w: c.WindowUS, gen: gen}
		}
		out[i].MarkKey, out[i].MarkOff = marksKey(c.Key, m.id, gen), s.off
		s.off++
		m.next[c.Key] = s
	}
	m.sweepLocked(now)
	return out
}

// sweepLocked forgets the counters not charged in their window in force,
// once the map has doubled since the last sweep: it holds the counters
// charged in about a window.
func (m *marker) sweepLocked(now time.Time) {
	if len(m.next) < max(1024, 2*m.swept) {
		return
	}
	us := now.UnixMicro()
	for k, s := range m.next {
		if s.gen < us/s.w {
			delete(m.next, k)
		}
	}
	m.swept = len(m.next)
}

// marksKey is the key of the charge marks of counter key by process id in
// window gen: in the counter's Cluster hash slot.
func marksKey(key, id string, gen int64) string {
	return slotKey(key, "|charged|"+id+"|"+strconv.FormatInt(gen, 10))
}

// slotKey is key's companion named by suffix, in key's Cluster hash slot
// (its hash tag is key's own, or key whole).
func slotKey(key, suffix string) string {
	if open := strings.IndexByte(key, '{'); open >= 0 {
		if n := strings.IndexByte(key[open+1:], '}'); n > 0 {
			return key + suffix
		}
	}
	// Encoded keys escape braces: only a key prefix with a lone '}' ends
	// this tag early (on a Cluster home a settle of such a key is refused).
	return "{" + key + "}" + suffix
}
