package service

import (
	"fmt"
	"math"
	"strconv"
	"strings"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
)

// The header names envoyproxy/ratelimit uses by default.
const (
	HeaderLimit     = "RateLimit-Limit"
	HeaderRemaining = "RateLimit-Remaining"
	HeaderReset     = "RateLimit-Reset"
)

// HeaderNames are the names of the legacy style's headers.
type HeaderNames struct {
	Limit, Remaining, Reset string
}

func (n HeaderNames) withDefaults() HeaderNames {
	for _, f := range []struct {
		name *string
		def  string
	}{{&n.Limit, HeaderLimit}, {&n.Remaining, HeaderRemaining}, {&n.Reset, HeaderReset}} {
		if *f.name == "" {
			*f.name = f.def
		}
	}
	return n
}

// ValidHeaderName reports whether s is an HTTP field name (RFC 9110's
// token): Envoy refuses to add anything else.
func ValidHeaderName(s string) bool {
	if s == "" {
		return false
	}
	for _, c := range []byte(s) {
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0) {
			return false
		}
	}
	return true
}

// HeaderStyle selects the rate-limit headers added to responses.
type HeaderStyle uint8

// The header styles.
const (
	// HeadersOff adds none.
	HeadersOff HeaderStyle = iota
	// HeadersLegacy adds RateLimit-Limit, RateLimit-Remaining and
	// RateLimit-Reset, as envoyproxy/ratelimit does.
	HeadersLegacy
	// HeadersDraft11 adds the IETF httpapi draft-11 structured fields
	// RateLimit-Policy and RateLimit.
	HeadersDraft11
)

// Header names beyond the legacy ones.
const (
	HeaderPolicy     = "RateLimit-Policy"
	HeaderRateLimit  = "RateLimit"
	HeaderRetryAfter = "Retry-After"
)

// headers describes the most constraining decided descriptor: the first
// one over its limit (quota-mode ones aside), else the one with the
// fewest remaining, the first on a tie. Descriptors answered by failure
// policy are left out: nothing is known of them.
func headers(style HeaderStyle, names HeaderNames, items []item, statuses []*rlsv3.RateLimitResponse_DescriptorStatus, states []checkState) []*corev3.HeaderValue {
	// remaining is a status's limit_remaining, whole: the response's
	// field is a uint32, a budget may hold more.
	remaining := func(i int) uint64 {
		if r := statuses[i].GetLimitRemaining(); r < math.MaxUint32 {
			return uint64(r)
		}
		return states[items[i].check].res.Remaining
	}
	best := -1
	for i, st := range statuses {
		if st.GetCurrentLimit() == nil || states[items[i].check].failed {
			continue
		}
		if st.GetCode() == rlsv3.RateLimitResponse_OVER_LIMIT && !items[i].quota {
			best = i
			break
		}
		if best < 0 || remaining(i) < remaining(best) {
			best = i
		}
	}
	if best < 0 {
		return nil
	}
	st := statuses[best]
	var out []*corev3.HeaderValue
	if style == HeadersDraft11 {
		// Every decided policy, then the state of the most constraining.
		var policy strings.Builder
		for i, s := range statuses {
			if s.GetCurrentLimit() == nil || states[items[i].check].failed {
				continue
			}
			if policy.Len() > 0 {
				policy.WriteString(", ")
			}
			fmt.Fprintf(&policy, "%s;q=%d;w=%d", sfString(items[i].label), items[i].rpu, items[i].windowUS/1e6)
		}
		out = append(out,
			&corev3.HeaderValue{Key: HeaderPolicy, Value: policy.String()},
			&corev3.HeaderValue{Key: HeaderRateLimit, Value: fmt.Sprintf("%s;r=%d;t=%d", sfString(items[best].label), remaining(best), resetSeconds(st))})
	} else {
		out = append(out,
			&corev3.HeaderValue{Key: names.Limit, Value: strconv.FormatUint(items[best].rpu, 10)},
			&corev3.HeaderValue{Key: names.Remaining, Value: strconv.FormatUint(remaining(best), 10)},
			&corev3.HeaderValue{Key: names.Reset, Value: strconv.FormatInt(resetSeconds(st), 10)})
	}
	// Retry-After on a rejection: the longest wait among the descriptors
	// over their limit, in whole seconds rounded up, at least 1.
	var retry int64
	for i, s := range statuses {
		if s.GetCode() == rlsv3.RateLimitResponse_OVER_LIMIT && !items[i].quota {
			retry = max(retry, resetSeconds(s), 1)
		}
	}
	if retry > 0 {
		out = append(out, &corev3.HeaderValue{Key: HeaderRetryAfter, Value: strconv.FormatInt(retry, 10)})
	}
	return out
}

// resetSeconds is a status's duration_until_reset in whole seconds,
// rounded up.
func resetSeconds(st *rlsv3.RateLimitResponse_DescriptorStatus) int64 {
	d := st.GetDurationUntilReset()
	secs := d.GetSeconds()
	if d.GetNanos() > 0 {
		secs++
	}
	return secs
}

// sfString encodes s as a Structured Field String (RFC 9651): quoted,
// with '"' and '\\' escaped and bytes outside printable ASCII dropped.
func sfString(s string) string {
	var b strings.Builder
	b.WriteByte('"')
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '"' || c == '\\':
			b.WriteByte('\\')
			b.WriteByte(c)
		case c >= 0x20 && c < 0x7f:
			b.WriteByte(c)
		}
	}
	b.WriteByte('"')
	return b.String()
}
