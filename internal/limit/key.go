package limit

import (
	"crypto/sha256"
	"encoding/base64"
	"strconv"
)

// KeyVersion is the first element of every counter key. Changing the
// encoding resets every counter in production, so it changes only with a
// new version.
const KeyVersion = "rl1"

// MaxEntriesLen bounds the encoded entries part of a key; longer entries
// are replaced by their SHA-256, so keys stay short whatever clients send.
const MaxEntriesLen = 256

// Encoder builds counter keys. The encoding is
//
//	<prefix>rl1:<domain>:<key>=<value>[:<key>=<value>...]|<algorithm tag>
//
// where domain, keys and values are escaped (see [appendEscaped]), so that
// no two distinct descriptors share a key: (a_b, c) and (a, b_c) differ, and
// so do ("a:b", "c") and ("a", "b:c"). When the escaped entries exceed
// [MaxEntriesLen] they become '#' and the unpadded base64url SHA-256 of
// their escaped form; '#' cannot start an escaped key, so hashed and plain
// keys never meet. The zero value is ready to use; reuse one per goroutine.
type Encoder struct {
	buf     []byte
	entries []byte
}

// Reset starts a key for domain under prefix.
func (e *Encoder) Reset(prefix, domain string) {
	e.buf = append(e.buf[:0], prefix...)
	e.buf = append(e.buf, KeyVersion...)
	e.buf = append(e.buf, ':')
	e.buf = appendEscaped(e.buf, domain)
	e.entries = e.entries[:0]
}

// Entry adds one descriptor entry.
func (e *Encoder) Entry(key, value string) {
	if len(e.entries) > 0 {
		e.entries = append(e.entries, ':')
	}
	e.entries = appendEscaped(e.entries, key)
	e.entries = append(e.entries, '=')
	e.entries = appendEscaped(e.entries, value)
}

// SharedEntry adds an entry whose counter every value matching the wildcard
// pattern shares (share_threshold). '#' is escaped in values, so a shared
// entry never meets a plain one.
func (e *Encoder) SharedEntry(key, pattern string) {
	if len(e.entries) > 0 {
		e.entries = append(e.entries, ':')
	}
	e.entries = appendEscaped(e.entries, key)
	e.entries = append(e.entries, '=', '#')
	e.entries = appendEscaped(e.entries, pattern)
}

// KeyFor finishes the key with the tag of [Tag](a, windowUS), written in
// place: the hot path builds a key with a single allocation.
func (e *Encoder) KeyFor(a Algorithm, windowUS int64) string {
	e.finishEntries()
	e.buf = appendTag(e.buf, a, windowUS)
	return string(e.buf)
}

// finishEntries appends the (possibly hashed) entries and the tag
// separator.
func (e *Encoder) finishEntries() {
	e.buf = append(e.buf, ':')
	if len(e.entries) > MaxEntriesLen {
		sum := sha256.Sum256(e.entries)
		e.buf = append(e.buf, '#')
		e.buf = base64.RawURLEncoding.AppendEncode(e.buf, sum[:])
	} else {
		e.buf = append(e.buf, e.entries...)
	}
	e.buf = append(e.buf, '|')
}

// Key finishes the key with the algorithm tag, e.g. [FixedWindowTag].
func (e *Encoder) Key(tag string) string {
	e.finishEntries()
	e.buf = append(e.buf, tag...)
	return string(e.buf)
}

// FixedWindowTag is the algorithm tag of a fixed window of windowUS
// microseconds: a change of unit never reuses another unit's counter.
func FixedWindowTag(windowUS int64) string { return Tag(FixedWindow, windowUS) }

// Tag is the key's algorithm tag: "fw", "sw" or "tb", then the window in
// seconds, so that a change of algorithm, unit or multiplier never reads
// a counter of another meaning.
func Tag(a Algorithm, windowUS int64) string { return string(appendTag(nil, a, windowUS)) }

func appendTag(b []byte, a Algorithm, windowUS int64) []byte {
	switch a {
	case SlidingWindow:
		b = append(b, "sw"...)
	case TokenBucket:
		b = append(b, "tb"...)
	default:
		b = append(b, "fw"...)
	}
	b = strconv.AppendInt(b, windowUS/1e6, 10)
	return append(b, 's')
}

// appendEscaped percent-encodes the bytes the encoding uses as
// separators ('%', ':', '=', '|', '#'), Redis Cluster hash-tag braces, and
// control bytes, so a value can never forge a separator or a hash tag.
func appendEscaped(b []byte, s string) []byte {
	const hex = "0123456789ABCDEF"
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '%' || c == ':' || c == '=' || c == '|' || c == '#' || c == '{' || c == '}' || c < 0x20 || c == 0x7f:
			b = append(b, '%', hex[c>>4], hex[c&15])
		default:
			b = append(b, c)
		}
	}
	return b
}
