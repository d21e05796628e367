package server

import (
	"unicode/utf8"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/durationpb"
)

// responseSize is the length of resp's protobuf encoding by
// appendResponse, for what the service sets: the overall code, statuses
// (code, current limit with its name, unit and multiplier, remaining,
// time to reset), headers and a raw body. ok is false for anything else
// (dynamic metadata, quota, unknown fields, nil elements, text that is
// not UTF-8, which protobuf-go refuses): protobuf-go encodes those.
// protobuf-go sizes a message by walking its coder tables, then walks them
// again to write it; for these few fields the two plain passes cost a
// fraction of that.
func responseSize(resp *rlsv3.RateLimitResponse) (n int, ok bool) {
	if resp.DynamicMetadata != nil || resp.Quota != nil || unknown(resp) {
		return 0, false
	}
	n = enumSize(int32(resp.OverallCode)) + bytesSize(len(resp.RawBody))
	for _, st := range resp.Statuses {
		if !statusTaken(st) {
			return 0, false
		}
		n += 1 + protowire.SizeBytes(statusSize(st))
	}
	for _, hs := range [][]*corev3.HeaderValue{resp.ResponseHeadersToAdd, resp.RequestHeadersToAdd} {
		for _, h := range hs {
			if h == nil || unknown(h) || !utf8.ValidString(h.Key) || !utf8.ValidString(h.Value) {
				return 0, false
			}
			n += 1 + protowire.SizeBytes(headerSize(h))
		}
	}
	return n, true
}

// appendResponse appends resp as proto.Marshal writes it (fields in
// number order), once responseSize has taken it: the checks are made
// there, once; the sizes here are arithmetic.
func appendResponse(b []byte, resp *rlsv3.RateLimitResponse) []byte {
	b = appendEnumField(b, 1, int32(resp.OverallCode))
	for _, st := range resp.Statuses {
		b = protowire.AppendVarint(protowire.AppendTag(b, 2, protowire.BytesType), uint64(statusSize(st)))
		b = appendStatusProto(b, st)
	}
	for i, hs := range [][]*corev3.HeaderValue{resp.ResponseHeadersToAdd, resp.RequestHeadersToAdd} {
		for _, h := range hs {
			b = protowire.AppendVarint(protowire.AppendTag(b, protowire.Number(3+i), protowire.BytesType), uint64(headerSize(h)))
			b = appendStringField(b, 1, h.Key)
			b = appendStringField(b, 2, h.Value)
			b = appendBytesField(b, 3, h.RawValue)
		}
	}
	return appendBytesField(b, 5, resp.RawBody)
}

// statusTaken reports a status appendStatusProto writes as protobuf-go
// would: no quota, no unknown fields, UTF-8 text.
func statusTaken(st *rlsv3.RateLimitResponse_DescriptorStatus) bool {
	if st == nil || st.Quota != nil || unknown(st) {
		return false
	}
	if l := st.CurrentLimit; l != nil && (unknown(l) || !utf8.ValidString(l.Name) || (l.UnitMultiplier != nil && unknown(l.UnitMultiplier))) {
		return false
	}
	return st.DurationUntilReset == nil || !unknown(st.DurationUntilReset)
}

func statusSize(st *rlsv3.RateLimitResponse_DescriptorStatus) int {
	n := enumSize(int32(st.Code)) + varintSize(uint64(st.LimitRemaining))
	if l := st.CurrentLimit; l != nil {
		n += 1 + protowire.SizeBytes(limitSize(l))
	}
	if d := st.DurationUntilReset; d != nil {
		n += 1 + protowire.SizeBytes(durationSize(d))
	}
	return n
}

func appendStatusProto(b []byte, st *rlsv3.RateLimitResponse_DescriptorStatus) []byte {
	b = appendEnumField(b, 1, int32(st.Code))
	if l := st.CurrentLimit; l != nil {
		b = protowire.AppendVarint(protowire.AppendTag(b, 2, protowire.BytesType), uint64(limitSize(l)))
		b = appendVarintField(b, 1, uint64(l.RequestsPerUnit))
		b = appendEnumField(b, 2, int32(l.Unit))
		b = appendStringField(b, 3, l.Name)
		if w := l.UnitMultiplier; w != nil {
			b = protowire.AppendVarint(protowire.AppendTag(b, 4, protowire.BytesType), uint64(varintSize(uint64(w.Value))))
			b = appendVarintField(b, 1, uint64(w.Value))
		}
	}
	b = appendVarintField(b, 3, uint64(st.LimitRemaining))
	if d := st.DurationUntilReset; d != nil {
		b = protowire.AppendVarint(protowire.AppendTag(b, 4, protowire.BytesType), uint64(durationSize(d)))
		b = appendVarintField(b, 1, uint64(d.Seconds))
		b = appendVarintField(b, 2, uint64(int64(d.Nanos)))
	}
	return b
}

func limitSize(l *rlsv3.RateLimitResponse_RateLimit) int {
	n := varintSize(uint64(l.RequestsPerUnit)) + enumSize(int32(l.Unit)) + bytesSize(len(l.Name))
	if w := l.UnitMultiplier; w != nil {
		n += 1 + protowire.SizeBytes(varintSize(uint64(w.Value)))
	}
	return n
}

func durationSize(d *durationpb.Duration) int {
	return varintSize(uint64(d.Seconds)) + varintSize(uint64(int64(d.Nanos)))
}

func headerSize(h *corev3.HeaderValue) int {
	return bytesSize(len(h.Key)) + bytesSize(len(h.Value)) + bytesSize(len(h.RawValue))
}

// unknown reports unknown fields, which proto.Marshal would write too.
func unknown(m interface{ ProtoReflect() protoreflect.Message }) bool {
	return len(m.ProtoReflect().GetUnknown()) > 0
}

// The sizes and writers of one field of a field number below 16 (a
// one-byte tag), left out at its zero value as proto3 does.

func varintSize(v uint64) int {
	if v == 0 {
		return 0
	}
	return 1 + protowire.SizeVarint(v)
}

// enumSize is an enum's (an int32's): negative values take ten bytes.
func enumSize(v int32) int { return varintSize(uint64(int64(v))) }

func bytesSize(n int) int {
	if n == 0 {
		return 0
	}
	return 1 + protowire.SizeBytes(n)
}

func appendVarintField(b []byte, num protowire.Number, v uint64) []byte {
	if v == 0 {
		return b
	}
	return protowire.AppendVarint(protowire.AppendTag(b, num, protowire.VarintType), v)
}

func appendEnumField(b []byte, num protowire.Number, v int32) []byte {
	return appendVarintField(b, num, uint64(int64(v)))
}

func appendStringField(b []byte, num protowire.Number, s string) []byte {
	if s == "" {
		return b
	}
	return protowire.AppendString(protowire.AppendTag(b, num, protowire.BytesType), s)
}

func appendBytesField(b []byte, num protowire.Number, v []byte) []byte {
	if len(v) == 0 {
		return b
	}
	return protowire.AppendBytes(protowire.AppendTag(b, num, protowire.BytesType), v)
}
