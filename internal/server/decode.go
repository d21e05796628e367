package server

import (
	"strings"
	"unicode/utf8"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// Field numbers of the messages decodeRequest reads
// (envoy.service.ratelimit.v3.RateLimitRequest and
// envoy.extensions.common.ratelimit.v3.RateLimitDescriptor).
const (
	reqDomain, reqDescriptors, reqHitsAddend  protowire.Number = 1, 2, 3
	descEntries, descHitsAddend, descNegative protowire.Number = 1, 3, 4
	entryKey, entryValue, wrapperValue        protowire.Number = 1, 2, 1
)

// decodeRequest reads a RateLimitRequest as protobuf-go would, with far
// fewer allocations: its descriptors and entries one slab each, its text
// copied out of b (which gRPC reuses once Unmarshal returns). No string
// shares memory with the rest of the message, so that keeping one (a
// stat name, a log line, a span) never keeps a whole request alive: the
// strings a request keeps share one copy of their own while they total at
// most compactText bytes, and each has its own above that. It takes what
// Envoy sends — domain, descriptors of entries, hits_addend at either
// level, is_negative_hits — and reports false, leaving m unspecified, for
// anything else (a descriptor's limit override, unknown fields, a field
// repeated that protobuf would merge, text that is not UTF-8, a malformed
// message): its caller then hands the message to proto.Unmarshal, which
// decides it in full.
func decodeRequest(b []byte, m *rlsv3.RateLimitRequest) bool {
	ndesc, nent, ok := countRequest(b)
	if !ok {
		return false
	}
	proto.Reset(m)
	descs := make([]rlv3.RateLimitDescriptor, ndesc)
	if ndesc > 0 {
		m.Descriptors = make([]*rlv3.RateLimitDescriptor, ndesc)
	}
	ents := make([]rlv3.RateLimitDescriptor_Entry, nent)
	entPtrs := make([]*rlv3.RateLimitDescriptor_Entry, nent)
	var stack [16]textSpan
	spans := stack[:0]
	domain := textSpan{dst: &m.Domain}
	d, e := 0, 0
	for off := 0; off < len(b); {
		num, typ, n := protowire.ConsumeTag(b[off:])
		off += n
		switch {
		case num == reqDomain && typ == protowire.BytesType:
			// The last one wins, as in protobuf.
			v, n := protowire.ConsumeBytes(b[off:])
			domain.start, domain.end = off+n-len(v), off+n
			off += n
		case num == reqHitsAddend && typ == protowire.VarintType:
			v, n := protowire.ConsumeVarint(b[off:])
			m.HitsAddend = uint32(v)
			off += n
		default: // a descriptor: countRequest let nothing else through
			v, n := protowire.ConsumeBytes(b[off:])
			base := off + n - len(v)
			off += n
			desc := &descs[d]
			m.Descriptors[d] = desc
			d++
			first := e
			spans = decodeDescriptor(v, base, desc, ents, entPtrs, &e, spans)
			if e > first {
				desc.Entries = entPtrs[first:e:e]
			}
		}
	}
	if domain.end > domain.start {
		spans = append(spans, domain)
	}
	copyText(b, spans)
	return true
}

// compactText is the most text a request's strings share one copy for:
// what keeping any one of them can keep alive.
const compactText = 512

// textSpan is a string of the message still to copy: b[start:end] into
// *dst.
type textSpan struct {
	dst        *string
	start, end int
}

// copyText gives each span's string its copy: one shared copy while they
// total at most compactText bytes, else one each.
func copyText(b []byte, spans []textSpan) {
	total := 0
	for _, sp := range spans {
		total += sp.end - sp.start
	}
	if total > compactText {
		for _, sp := range spans {
			*sp.dst = string(b[sp.start:sp.end])
		}
		return
	}
	var sb strings.Builder
	sb.Grow(total)
	for _, sp := range spans {
		sb.Write(b[sp.start:sp.end])
	}
	text, pos := sb.String(), 0
	for _, sp := range spans {
		n := sp.end - sp.start
		*sp.dst = text[pos : pos+n]
		pos += n
	}
}

// decodeDescriptor fills desc from v, which starts at base in the
// message and which countDescriptor has checked, taking its entries from
// ents at *e onwards; it adds the spans of their text to spans.
func decodeDescriptor(v []byte, base int, desc *rlv3.RateLimitDescriptor,
	ents []rlv3.RateLimitDescriptor_Entry, ptrs []*rlv3.RateLimitDescriptor_Entry, e *int, spans []textSpan) []textSpan {
	for off := 0; off < len(v); {
		num, _, n := protowire.ConsumeTag(v[off:])
		off += n
		switch num {
		case descEntries:
			ev, n := protowire.ConsumeBytes(v[off:])
			ebase := base + off + n - len(ev)
			off += n
			ent := &ents[*e]
			ptrs[*e] = ent
			*e++
			for eoff := 0; eoff < len(ev); {
				enum, _, n := protowire.ConsumeTag(ev[eoff:])
				eoff += n
				sv, n := protowire.ConsumeBytes(ev[eoff:])
				sp := textSpan{dst: &ent.Value, start: ebase + eoff + n - len(sv), end: ebase + eoff + n}
				if enum == entryKey {
					sp.dst = &ent.Key
				}
				eoff += n
				spans = append(spans, sp)
			}
		case descHitsAddend:
			wv, n := protowire.ConsumeBytes(v[off:])
			off += n
			w := &wrapperspb.UInt64Value{}
			for woff := 0; woff < len(wv); {
				_, _, n := protowire.ConsumeTag(wv[woff:])
				woff += n
				x, n := protowire.ConsumeVarint(wv[woff:])
				woff += n
				w.Value = x
			}
			desc.HitsAddend = w
		default: // is_negative_hits
			x, n := protowire.ConsumeVarint(v[off:])
			off += n
			desc.IsNegativeHits = x != 0
		}
	}
	return spans
}

// countRequest walks the whole message once, checking every field as
// decodeRequest will read it, and counts descriptors and entries.
func countRequest(b []byte) (ndesc, nent int, ok bool) {
	for off := 0; off < len(b); {
		num, typ, n := protowire.ConsumeTag(b[off:])
		if n < 0 {
			return 0, 0, false
		}
		off += n
		switch {
		case num == reqDomain && typ == protowire.BytesType:
			v, n := protowire.ConsumeBytes(b[off:])
			if n < 0 || !utf8.Valid(v) {
				return 0, 0, false
			}
			off += n
		case num == reqHitsAddend && typ == protowire.VarintType:
			_, n := protowire.ConsumeVarint(b[off:])
			if n < 0 {
				return 0, 0, false
			}
			off += n
		case num == reqDescriptors && typ == protowire.BytesType:
			v, n := protowire.ConsumeBytes(b[off:])
			if n < 0 {
				return 0, 0, false
			}
			off += n
			k, ok := countDescriptor(v)
			if !ok {
				return 0, 0, false
			}
			ndesc++
			nent += k
		default:
			return 0, 0, false
		}
	}
	return ndesc, nent, true
}

// countDescriptor checks a descriptor and counts its entries.
func countDescriptor(v []byte) (nent int, ok bool) {
	hits := false
	for off := 0; off < len(v); {
		num, typ, n := protowire.ConsumeTag(v[off:])
		if n < 0 {
			return 0, false
		}
		off += n
		switch {
		case num == descEntries && typ == protowire.BytesType:
			ev, n := protowire.ConsumeBytes(v[off:])
			if n < 0 || !validEntry(ev) {
				return 0, false
			}
			off += n
			nent++
		case num == descHitsAddend && typ == protowire.BytesType && !hits:
			// Twice would be merged by protobuf: left to it.
			hits = true
			wv, n := protowire.ConsumeBytes(v[off:])
			if n < 0 || !validWrapper(wv) {
				return 0, false
			}
			off += n
		case num == descNegative && typ == protowire.VarintType:
			_, n := protowire.ConsumeVarint(v[off:])
			if n < 0 {
				return 0, false
			}
			off += n
		default: // the limit override, unknown fields
			return 0, false
		}
	}
	return nent, true
}

// validEntry checks an entry: a key and a value, each UTF-8 text.
func validEntry(v []byte) bool {
	for off := 0; off < len(v); {
		num, typ, n := protowire.ConsumeTag(v[off:])
		if n < 0 || typ != protowire.BytesType || (num != entryKey && num != entryValue) {
			return false
		}
		off += n
		s, n := protowire.ConsumeBytes(v[off:])
		if n < 0 || !utf8.Valid(s) {
			return false
		}
		off += n
	}
	return true
}

// validWrapper checks a google.protobuf.UInt64Value: its value at most.
func validWrapper(v []byte) bool {
	for off := 0; off < len(v); {
		num, typ, n := protowire.ConsumeTag(v[off:])
		if n < 0 || num != wrapperValue || typ != protowire.VarintType {
			return false
		}
		off += n
		_, n = protowire.ConsumeVarint(v[off:])
		if n < 0 {
			return false
		}
		off += n
	}
	return true
}
