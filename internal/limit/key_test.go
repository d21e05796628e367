package limit

import (
	"strings"
	"testing"
)

func key(domain string, kv ...string) string {
	var e Encoder
	e.Reset("p:", domain)
	for i := 0; i+1 < len(kv); i += 2 {
		e.Entry(kv[i], kv[i+1])
	}
	return e.Key(FixedWindowTag(60e6))
}

func TestKeyEncoding(t *testing.T) {
	tests := []struct {
		name string
		give []string
		want string
	}{
		{"plain", []string{"d", "k", "v"}, "p:rl1:d:k=v|fw60s"},
		{"two entries", []string{"d", "a", "1", "b", "2"}, "p:rl1:d:a=1:b=2|fw60s"},
		{"separators escaped", []string{"d:x", "a=b", "c:d|e#%"}, "p:rl1:d%3Ax:a%3Db=c%3Ad%7Ce%23%25|fw60s"},
		{"hash tag escaped", []string{"d", "user", "{x}"}, "p:rl1:d:user=%7Bx%7D|fw60s"},
		{"empty value", []string{"d", "k", ""}, "p:rl1:d:k=|fw60s"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := key(tt.give[0], tt.give[1:]...); got != tt.want {
				t.Errorf("key = %q, want %q", got, tt.want)
			}
		})
	}
}

func TestKeyDistinct(t *testing.T) {
	pairs := [][2]string{
		{key("d", "a_b", "c"), key("d", "a", "b_c")},
		{key("d", "a:b", "c"), key("d", "a", "b:c")},
		{key("d", "a", "b=c"), key("d", "a=b", "c")},
		{key("d", "a", "b", "c", "d"), key("d", "a", "b:c=d")},
		{key("d:a", "b", "c"), key("d", "a:b", "c")},
	}
	for _, p := range pairs {
		if p[0] == p[1] {
			t.Errorf("collision: %q", p[0])
		}
	}
	if key("d", "a", "1") == func() string {
		var e Encoder
		e.Reset("p:", "d")
		e.Entry("a", "1")
		return e.Key(FixedWindowTag(1e6))
	}() {
		t.Error("different windows share a key")
	}
}

func TestKeyBoundedLength(t *testing.T) {
	long := strings.Repeat("v", 10000)
	k1, k2 := key("d", "k", long), key("d", "k", long+"x")
	if len(k1) > 100 {
		t.Errorf("key length %d, want bounded", len(k1))
	}
	if k1 == k2 {
		t.Error("long values share a key")
	}
	if !strings.HasPrefix(k1, "p:rl1:d:#") {
		t.Errorf("hashed key = %q", k1)
	}
}

// FuzzCacheKey checks that the encoding is injective: two different
// descriptors (split at any point) never give one key.
func FuzzCacheKey(f *testing.F) {
	f.Add("d", "a_b", "c", "a", "b_c")
	f.Add("d", "a:b", "c", "a", "b:c")
	f.Add("d", "a", "b=c", "a=b", "c")
	f.Fuzz(func(t *testing.T, d, k1, v1, k2, v2 string) {
		if k1 == k2 && v1 == v2 {
			return
		}
		a, b := key(d, k1, v1), key(d, k2, v2)
		if a == b {
			t.Fatalf("(%q,%q) and (%q,%q) share key %q", k1, v1, k2, v2, a)
		}
		two := key(d, k1, v1, k2, v2)
		if two == key(d, k1+v1, k2+v2) || two == a {
			t.Fatalf("two-entry key %q collides", two)
		}
	})
}

func TestSharedEntryDistinct(t *testing.T) {
	var e Encoder
	e.Reset("", "d")
	e.SharedEntry("path", "files/*")
	shared := e.Key(FixedWindowTag(60e6))
	if shared != "rl1:d:path=#files/*|fw60s" {
		t.Errorf("shared key = %q", shared)
	}
	for _, v := range []string{"files/*", "#files/*"} {
		if key("d", "path", v) == "p:"+shared {
			t.Errorf("value %q shares the pattern's counter", v)
		}
	}
}

func TestKeyForMatchesTag(t *testing.T) {
	for _, a := range []Algorithm{FixedWindow, SlidingWindow, TokenBucket} {
		for _, w := range []int64{1e6, 300e6} {
			var e1, e2 Encoder
			for _, e := range []*Encoder{&e1, &e2} {
				e.Reset("p:", "d")
				e.Entry("k", strings.Repeat("v", 300)) // hashed entries too
			}
			if k1, k2 := e1.KeyFor(a, w), e2.Key(Tag(a, w)); k1 != k2 {
				t.Errorf("KeyFor = %q, Key(Tag) = %q", k1, k2)
			}
		}
	}
}
