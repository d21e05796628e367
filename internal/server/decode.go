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
// decides it in full. It walks the message once, checking as it reads;
// the slabs grow as it goes, so pointers into them are taken at the end.
func decodeRequest(b []byte, m *rlsv3.RateLimitRequest) bool {
	var d requestDecoder
	d.descs, d.text = d.descStack[:0], d.textStack[:0]
	if !d.walk(b, m) {
		return false
	}
	d.finish(b, m)
	return true
}

// requestDecoder holds what one walk has read: the descriptors (each
// with its entries' range in ents), the entries, and the text still to
// copy, by index. Small requests fit the arrays inside it.
type requestDecoder struct {
	descs     []decodedDesc
	nent      int // entries read
	text      []entryText
	domain    [2]int // start and end of the domain's text; end 0: none
	descStack [4]decodedDesc
	textStack [16]entryText
}

type decodedDesc struct {
	hits        *wrapperspb.UInt64Value
	negative    bool
	first, last int // its entries: ents[first:last]
}

// entryText is an entry's key (value false) or value, b[start:end].
type entryText struct {
	ent        int
	value      bool
	start, end int
}

// walk reads and checks the message, in one pass.
func (d *requestDecoder) walk(b []byte, m *rlsv3.RateLimitRequest) bool {
	var hits uint32
	for off := 0; off < len(b); {
		num, typ, n := protowire.ConsumeTag(b[off:])
		if n < 0 {
			return false
		}
		off += n
		switch {
		case num == reqDomain && typ == protowire.BytesType:
			v, n := protowire.ConsumeBytes(b[off:])
			if n < 0 || !utf8.Valid(v) {
				return false
			}
			// The last one wins, as in protobuf.
			d.domain = [2]int{off + n - len(v), off + n}
			off += n
		case num == reqHitsAddend && typ == protowire.VarintType:
			v, n := protowire.ConsumeVarint(b[off:])
			if n < 0 {
				return false
			}
			hits = uint32(v)
			off += n
		case num == reqDescriptors && typ == protowire.BytesType:
			v, n := protowire.ConsumeBytes(b[off:])
			if n < 0 || !d.descriptor(v, off+n-len(v)) {
				return false
			}
			off += n
		default:
			return false
		}
	}
	m.HitsAddend = hits
	return true
}

// descriptor reads one descriptor, v, which starts at base in the
// message.
func (d *requestDecoder) descriptor(v []byte, base int) bool {
	desc := decodedDesc{first: d.nent}
	for off := 0; off < len(v); {
		num, typ, n := protowire.ConsumeTag(v[off:])
		if n < 0 {
			return false
		}
		off += n
		switch {
		case num == descEntries && typ == protowire.BytesType:
			ev, n := protowire.ConsumeBytes(v[off:])
			if n < 0 || !d.entry(ev, base+off+n-len(ev)) {
				return false
			}
			off += n
		case num == descHitsAddend && typ == protowire.BytesType && desc.hits == nil:
			// Twice would be merged by protobuf: left to it.
			wv, n := protowire.ConsumeBytes(v[off:])
			if n < 0 {
				return false
			}
			w, ok := readWrapper(wv)
			if !ok {
				return false
			}
			desc.hits = w
			off += n
		case num == descNegative && typ == protowire.VarintType:
			x, n := protowire.ConsumeVarint(v[off:])
			if n < 0 {
				return false
			}
			desc.negative = x != 0
			off += n
		default: // the limit override, unknown fields
			return false
		}
	}
	desc.last = d.nent
	d.descs = append(d.descs, desc)
	return true
}

// entry reads an entry, ev at base: a key and a value, each UTF-8 text.
func (d *requestDecoder) entry(ev []byte, base int) bool {
	e := d.nent
	d.nent++
	for off := 0; off < len(ev); {
		num, typ, n := protowire.ConsumeTag(ev[off:])
		if n < 0 || typ != protowire.BytesType || (num != entryKey && num != entryValue) {
			return false
		}
		off += n
		s, n := protowire.ConsumeBytes(ev[off:])
		if n < 0 || !utf8.Valid(s) {
			return false
		}
		d.text = append(d.text, entryText{ent: e, value: num == entryValue, start: base + off + n - len(s), end: base + off + n})
		off += n
	}
	return true
}

// readWrapper reads a google.protobuf.UInt64Value: its value at most.
func readWrapper(v []byte) (*wrapperspb.UInt64Value, bool) {
	w := &wrapperspb.UInt64Value{}
	for off := 0; off < len(v); {
		num, typ, n := protowire.ConsumeTag(v[off:])
		if n < 0 || num != wrapperValue || typ != protowire.VarintType {
			return nil, false
		}
		off += n
		x, n := protowire.ConsumeVarint(v[off:])
		if n < 0 {
			return nil, false
		}
		w.Value = x
		off += n
	}
	return w, true
}

// finish fills m from what the walk read: the slabs are final now, so
// pointers into them hold.
func (d *requestDecoder) finish(b []byte, m *rlsv3.RateLimitRequest) {
	hits := m.HitsAddend
	proto.Reset(m)
	m.HitsAddend = hits
	if n := len(d.descs); n > 0 {
		descs := make([]rlv3.RateLimitDescriptor, n)
		m.Descriptors = make([]*rlv3.RateLimitDescriptor, n)
		ents := make([]rlv3.RateLimitDescriptor_Entry, d.nent)
		ptrs := make([]*rlv3.RateLimitDescriptor_Entry, d.nent)
		for i := range ents {
			ptrs[i] = &ents[i]
		}
		for i, dd := range d.descs {
			desc := &descs[i]
			desc.HitsAddend, desc.IsNegativeHits = dd.hits, dd.negative
			if dd.last > dd.first {
				desc.Entries = ptrs[dd.first:dd.last:dd.last]
			}
			m.Descriptors[i] = desc
		}
		var stack [16]textSpan
		spans := stack[:0]
		for _, t := range d.text {
			dst := &ents[t.ent].Key
			if t.value {
				dst = &ents[t.ent].Value
			}
			spans = append(spans, textSpan{dst: dst, start: t.start, end: t.end})
		}
		if d.domain[1] > d.domain[0] {
			spans = append(spans, textSpan{dst: &m.Domain, start: d.domain[0], end: d.domain[1]})
		}
		copyText(b, spans)
		return
	}
	if d.domain[1] > d.domain[0] {
		copyText(b, []textSpan{{dst: &m.Domain, start: d.domain[0], end: d.domain[1]}})
	}
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
