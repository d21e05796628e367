package server

import (
	"strconv"
	"unicode/utf8"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/durationpb"
)

// appendResponseJSON appends resp in protojson's JSON mapping (field names
// in lowerCamelCase, enums by name, zero values left out, durations as
// "1.5s"), for what the service sets: the overall code, the statuses and
// the headers. protojson walks a message by reflection and sorts its
// fields, which was a fifth of a /json request's cost. ok is false for a
// response with anything else (raw body, dynamic metadata, quota, raw
// header values, text that is not UTF-8): protojson encodes those. The
// differential test holds the two equal.
func appendResponseJSON(b []byte, resp *rlsv3.RateLimitResponse) (_ []byte, ok bool) {
	if len(resp.GetRawBody()) > 0 || resp.GetDynamicMetadata() != nil || resp.GetQuota() != nil {
		return b, false
	}
	b = append(b, '{')
	start := len(b)
	if c := resp.GetOverallCode(); c != 0 {
		b = appendEnum(appendKey(b, start, "overallCode"), rlsv3.RateLimitResponse_Code_name, int32(c))
	}
	if st := resp.GetStatuses(); len(st) > 0 {
		b = append(appendKey(b, start, "statuses"), '[')
		for i, s := range st {
			if i > 0 {
				b = append(b, ',')
			}
			if b, ok = appendStatus(b, s); !ok {
				return b, false
			}
		}
		b = append(b, ']')
	}
	for _, hs := range []struct {
		name string
		hv   []*corev3.HeaderValue
	}{{"responseHeadersToAdd", resp.GetResponseHeadersToAdd()}, {"requestHeadersToAdd", resp.GetRequestHeadersToAdd()}} {
		if len(hs.hv) == 0 {
			continue
		}
		if b, ok = appendHeaders(appendKey(b, start, hs.name), hs.hv); !ok {
			return b, false
		}
	}
	return append(b, '}'), true
}

// appendKey writes a field's name, after a comma unless it is the first
// of an object whose fields start at start.
func appendKey(b []byte, start int, name string) []byte {
	if len(b) > start {
		b = append(b, ',')
	}
	b = append(b, '"')
	b = append(b, name...)
	return append(b, '"', ':')
}

func appendStatus(b []byte, s *rlsv3.RateLimitResponse_DescriptorStatus) ([]byte, bool) {
	if s.GetQuota() != nil {
		return b, false
	}
	var ok bool
	b = append(b, '{')
	start := len(b)
	if c := s.GetCode(); c != 0 {
		b = appendEnum(appendKey(b, start, "code"), rlsv3.RateLimitResponse_Code_name, int32(c))
	}
	if l := s.GetCurrentLimit(); l != nil {
		if b, ok = appendLimit(appendKey(b, start, "currentLimit"), l); !ok {
			return b, false
		}
	}
	if v := s.GetLimitRemaining(); v != 0 {
		b = strconv.AppendUint(appendKey(b, start, "limitRemaining"), uint64(v), 10)
	}
	if d := s.GetDurationUntilReset(); d != nil {
		if b, ok = appendDuration(appendKey(b, start, "durationUntilReset"), d); !ok {
			return b, false
		}
	}
	return append(b, '}'), true
}

func appendLimit(b []byte, l *rlsv3.RateLimitResponse_RateLimit) ([]byte, bool) {
	var ok bool
	b = append(b, '{')
	start := len(b)
	if l.GetName() != "" {
		if b, ok = appendString(appendKey(b, start, "name"), l.GetName()); !ok {
			return b, false
		}
	}
	if v := l.GetRequestsPerUnit(); v != 0 {
		b = strconv.AppendUint(appendKey(b, start, "requestsPerUnit"), uint64(v), 10)
	}
	if u := l.GetUnit(); u != 0 {
		b = appendEnum(appendKey(b, start, "unit"), rlsv3.RateLimitResponse_RateLimit_Unit_name, int32(u))
	}
	if um := l.GetUnitMultiplier(); um != nil {
		b = strconv.AppendUint(appendKey(b, start, "unitMultiplier"), uint64(um.GetValue()), 10)
	}
	return append(b, '}'), true
}

func appendHeaders(b []byte, hv []*corev3.HeaderValue) ([]byte, bool) {
	var ok bool
	b = append(b, '[')
	for i, h := range hv {
		if len(h.GetRawValue()) > 0 {
			return b, false
		}
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, '{')
		start := len(b)
		if h.GetKey() != "" {
			if b, ok = appendString(appendKey(b, start, "key"), h.GetKey()); !ok {
				return b, false
			}
		}
		if h.GetValue() != "" {
			if b, ok = appendString(appendKey(b, start, "value"), h.GetValue()); !ok {
				return b, false
			}
		}
		b = append(b, '}')
	}
	return append(b, ']'), true
}

// appendEnum writes an enum value by name, or by number for a value the
// enum does not name, as protojson does.
func appendEnum(b []byte, names map[int32]string, v int32) []byte {
	if n, ok := names[v]; ok {
		b = append(b, '"')
		b = append(b, n...)
		return append(b, '"')
	}
	return strconv.AppendInt(b, int64(v), 10)
}

// appendDuration writes d as protojson does: seconds with 0, 3, 6 or 9
// fractional digits and an "s"; false for one out of its range.
func appendDuration(b []byte, d *durationpb.Duration) ([]byte, bool) {
	sec, nanos := d.GetSeconds(), d.GetNanos()
	const maxSec = 315576000000
	if sec < -maxSec || sec > maxSec || nanos <= -1e9 || nanos >= 1e9 || (sec > 0 && nanos < 0) || (sec < 0 && nanos > 0) {
		return b, false
	}
	b = append(b, '"')
	if sec < 0 || nanos < 0 {
		b = append(b, '-')
		sec, nanos = -sec, -nanos
	}
	b = strconv.AppendInt(b, sec, 10)
	if nanos != 0 {
		frac := strconv.AppendInt(nil, int64(nanos)+1e9, 10)[1:] // 9 digits
		switch {
		case nanos%1e6 == 0:
			frac = frac[:3]
		case nanos%1e3 == 0:
			frac = frac[:6]
		}
		b = append(b, '.')
		b = append(b, frac...)
	}
	return append(b, 's', '"'), true
}

// appendString writes s as a JSON string; false when s is not UTF-8
// (protojson refuses it).
func appendString(b []byte, s string) ([]byte, bool) {
	if !utf8.ValidString(s) {
		return b, false
	}
	const hex = "0123456789abcdef"
	b = append(b, '"')
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '"' || c == '\\':
			b = append(b, '\\', c)
		case c < 0x20:
			b = append(b, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
		default:
			b = append(b, c)
		}
	}
	return append(b, '"'), true
}
