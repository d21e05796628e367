package server

import (
	"unicode/utf8"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// marshalResponse writes resp as proto.Marshal does, through
// go-control-plane's generated vtprotobuf code (one sizing pass and one
// writing pass over plain fields, where protobuf-go walks its coder
// tables twice), when responseTaken takes it; ok is false otherwise, and
// in a build without the vtprotobuf tag: protobuf-go encodes it.
func marshalResponse(resp *rlsv3.RateLimitResponse) (b []byte, ok bool) {
	if !responseTaken(resp) {
		return nil, false
	}
	return encodeGenerated(resp)
}

// responseTaken reports a response of what the service sets: the overall
// code, statuses (code, current limit with its name, unit and multiplier,
// remaining, time to reset), headers and a raw body. The generated code
// writes text without checking it is UTF-8, which protobuf-go refuses,
// and writes a nil element of a list as an empty message, which
// protobuf-go refuses too; dynamic metadata, quota and unknown fields go
// to protobuf-go as well, so that what it would refuse stays refused.
func responseTaken(resp *rlsv3.RateLimitResponse) bool {
	if resp.DynamicMetadata != nil || resp.Quota != nil || unknown(resp) {
		return false
	}
	for _, st := range resp.Statuses {
		if !statusTaken(st) {
			return false
		}
	}
	for _, hs := range [][]*corev3.HeaderValue{resp.ResponseHeadersToAdd, resp.RequestHeadersToAdd} {
		for _, h := range hs {
			if h == nil || unknown(h) || !utf8.ValidString(h.Key) || !utf8.ValidString(h.Value) {
				return false
			}
		}
	}
	return true
}

func statusTaken(st *rlsv3.RateLimitResponse_DescriptorStatus) bool {
	if st == nil || st.Quota != nil || unknown(st) {
		return false
	}
	if l := st.CurrentLimit; l != nil && (unknown(l) || !utf8.ValidString(l.Name) || (l.UnitMultiplier != nil && unknown(l.UnitMultiplier))) {
		return false
	}
	return st.DurationUntilReset == nil || !unknown(st.DurationUntilReset)
}

// unknown reports unknown fields, which proto.Marshal would write too.
func unknown(m interface{ ProtoReflect() protoreflect.Message }) bool {
	return len(m.ProtoReflect().GetUnknown()) > 0
}
