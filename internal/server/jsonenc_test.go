package server

import (
	"math/rand/v2"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// TestResponseJSONMatchesProtojson: the /json encoder's output reads back,
// through protojson itself, as the very response encoded, over random
// responses of every field it handles; and it declines what it does not.
func TestResponseJSONMatchesProtojson(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for i := range 20000 {
		resp := randomResponse(rng)
		out, ok := appendResponseJSON(nil, resp)
		if !ok {
			t.Fatalf("case %d: declined %v", i, resp)
		}
		var back rlsv3.RateLimitResponse
		if err := protojson.Unmarshal(out, &back); err != nil {
			t.Fatalf("case %d: %s does not read back: %v", i, out, err)
		}
		if !proto.Equal(&back, resp) {
			t.Fatalf("case %d: %s reads back as %v, want %v", i, out, &back, resp)
		}
	}
	meta, _ := structpb.NewStruct(map[string]any{"decisions": []any{"x"}})
	for _, r := range []*rlsv3.RateLimitResponse{
		{DynamicMetadata: meta},
		{RawBody: []byte("x")},
		{Quota: &rlsv3.RateLimitResponse_Quota{Requests: 1}},
		{Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{{Quota: &rlsv3.RateLimitResponse_Quota{}}}},
		{ResponseHeadersToAdd: []*corev3.HeaderValue{{Key: "k", RawValue: []byte("v")}}},
		{ResponseHeadersToAdd: []*corev3.HeaderValue{{Key: "\xff"}}},
		{Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{{DurationUntilReset: &durationpb.Duration{Seconds: 1, Nanos: -1}}}},
	} {
		if _, ok := appendResponseJSON(nil, r); ok {
			t.Errorf("%v: encoded, want it left to protojson", r)
		}
	}
}

// randomResponse is a response of what the service sets: the overall
// code, statuses of every field, headers of key and value.
func randomResponse(rng *rand.Rand) *rlsv3.RateLimitResponse {
	strs := []string{"", "a", "per-ip", `quo"te`, `back\slash`, "tab\tnew\nline\x01", "ünïcødé 限", "<html>&"}
	pick := func() string { return strs[rng.IntN(len(strs))] }
	resp := &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_Code(rng.IntN(4))}
	for range rng.IntN(4) {
		st := &rlsv3.RateLimitResponse_DescriptorStatus{Code: rlsv3.RateLimitResponse_Code(rng.IntN(4)),
			LimitRemaining: []uint32{0, 1, 99, 1 << 31, 1<<32 - 1}[rng.IntN(5)]}
		if rng.IntN(4) > 0 {
			st.CurrentLimit = &rlsv3.RateLimitResponse_RateLimit{Name: pick(),
				RequestsPerUnit: []uint32{0, 1, 600, 1<<32 - 1}[rng.IntN(4)], Unit: rlsv3.RateLimitResponse_RateLimit_Unit(rng.IntN(9))}
			if rng.IntN(3) == 0 {
				st.CurrentLimit.UnitMultiplier = wrapperspb.UInt32(uint32(rng.IntN(100)))
			}
		}
		if rng.IntN(4) > 0 {
			sec := rng.Int64N(100000) * int64(1-2*rng.IntN(2))
			nanos := []int32{0, 1, 500_000_000, 123_000, 999_999_999, 7_000_000}[rng.IntN(6)]
			if sec < 0 {
				nanos = -nanos
			}
			st.DurationUntilReset = &durationpb.Duration{Seconds: sec, Nanos: nanos}
		}
		resp.Statuses = append(resp.Statuses, st)
	}
	for range rng.IntN(3) {
		resp.ResponseHeadersToAdd = append(resp.ResponseHeadersToAdd, &corev3.HeaderValue{Key: pick(), Value: pick()})
	}
	if rng.IntN(5) == 0 {
		resp.RequestHeadersToAdd = append(resp.RequestHeadersToAdd, &corev3.HeaderValue{Key: pick(), Value: pick()})
	}
	return resp
}
