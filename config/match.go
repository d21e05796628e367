package config

import (
	"strings"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
)

// Match returns the rule for a request descriptor's entries, or nil.
//
// The walk is envoyproxy/ratelimit's: at each level the exact key/value
// rule wins, then the first wildcard rule in file order, then the key-only
// rule; there is no backtracking; and a rule applies only when it sits at the
// depth of the request's last entry. Unlike envoyproxy/ratelimit, a wildcard
// matches the value only, never across the key/value boundary.
func (d *Domain) Match(entries []*rlcommon.RateLimitDescriptor_Entry) *Rule {
	if d == nil || len(entries) == 0 {
		return nil
	}
	lv := d.root
	var r *Rule
	for _, e := range entries {
		if lv == nil {
			return nil
		}
		kr := lv.byKey[e.GetKey()]
		if kr == nil {
			return nil
		}
		r = kr.lookup(e.GetValue())
		if r == nil {
			return nil
		}
		lv = r.children
	}
	return r
}

func (kr *keyRules) lookup(value string) *Rule {
	if value != "" {
		if r, ok := kr.exact[value]; ok {
			return r
		}
	}
	for _, r := range kr.wildcards {
		if wildcardMatch(r.wildcard, value) {
			return r
		}
	}
	return kr.def
}

// wildcardMatch reports whether s matches the pattern split on '*': it
// starts with the first part, ends with the last, and holds the middle
// parts in order between them. Each '*' matches zero or more bytes.
func wildcardMatch(parts []string, s string) bool {
	first, last := parts[0], parts[len(parts)-1]
	if len(s) < len(first)+len(last) || !strings.HasPrefix(s, first) || !strings.HasSuffix(s, last) {
		return false
	}
	mid := s[len(first) : len(s)-len(last)]
	for _, p := range parts[1 : len(parts)-1] {
		i := strings.Index(mid, p)
		if i < 0 {
			return false
		}
		mid = mid[i+len(p):]
	}
	return true
}
