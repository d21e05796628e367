package server

import (
	"bytes"
	"math/rand/v2"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
)

// TestResponseMatchesProtobuf: marshalResponse writes, byte for byte,
// what proto.Marshal writes, over random responses of every field it
// takes (and raw header values, raw bodies, negative codes); and it
// declines what protobuf-go must encode or refuse.
func TestResponseMatchesProtobuf(t *testing.T) {
	needGenerated(t)
	rng := rand.New(rand.NewPCG(7, 8))
	for i := range 20000 {
		resp := randomResponse(rng)
		if rng.IntN(5) == 0 {
			resp.RawBody = []byte("over the limit")
		}
		if rng.IntN(6) == 0 && len(resp.ResponseHeadersToAdd) > 0 {
			resp.ResponseHeadersToAdd[0].RawValue = []byte{0, 0xff, 'v'}
		}
		if rng.IntN(20) == 0 {
			resp.OverallCode = -1
		}
		want, err := proto.Marshal(resp)
		if err != nil {
			t.Fatal(err)
		}
		got, ok := marshalResponse(resp)
		if !ok {
			t.Fatalf("case %d: declined %v", i, resp)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("case %d: %v\nwrote %x\nproto %x", i, resp, got, want)
		}
	}
	meta, _ := structpb.NewStruct(map[string]any{"decisions": []any{"x"}})
	withUnknown := &rlsv3.RateLimitResponse_DescriptorStatus{}
	withUnknown.ProtoReflect().SetUnknown(protowire.AppendVarint(protowire.AppendTag(nil, 9, protowire.VarintType), 1))
	for _, r := range []*rlsv3.RateLimitResponse{
		{DynamicMetadata: meta},
		{Quota: &rlsv3.RateLimitResponse_Quota{Requests: 1}},
		{Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{{Quota: &rlsv3.RateLimitResponse_Quota{}}}},
		{Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{nil}},
		{Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{withUnknown}},
		{Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{{CurrentLimit: &rlsv3.RateLimitResponse_RateLimit{Name: "\xff"}}}},
		{ResponseHeadersToAdd: []*corev3.HeaderValue{{Key: "\xff"}}},
		{RequestHeadersToAdd: []*corev3.HeaderValue{nil}},
	} {
		if _, ok := marshalResponse(r); ok {
			t.Errorf("%v: taken, want it left to protobuf-go", r)
		}
	}
}

// BenchmarkMarshalResponse: a response of 1 and 3 statuses as the service
// sets them, by marshalResponse (the generated code) and by proto.Marshal.
// go test -run XXX -bench MarshalResponse -benchmem ./internal/server/
func BenchmarkMarshalResponse(b *testing.B) {
	for _, n := range []int{1, 3} {
		resp := &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK}
		for range n {
			resp.Statuses = append(resp.Statuses, &rlsv3.RateLimitResponse_DescriptorStatus{
				Code:               rlsv3.RateLimitResponse_OK,
				CurrentLimit:       &rlsv3.RateLimitResponse_RateLimit{RequestsPerUnit: 1000000000, Unit: rlsv3.RateLimitResponse_RateLimit_HOUR},
				LimitRemaining:     999999000,
				DurationUntilReset: &durationpb.Duration{Seconds: 1800},
			})
		}
		name := "statuses=" + string(rune('0'+n))
		b.Run(name+"/marshalResponse", func(b *testing.B) {
			needGenerated(b)
			for b.Loop() {
				_, _ = marshalResponse(resp)
			}
		})
		b.Run(name+"/proto.Marshal", func(b *testing.B) {
			for b.Loop() {
				_ = proto.Size(resp)
				if _, err := (proto.MarshalOptions{UseCachedSize: true}).Marshal(resp); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// needGenerated skips what only the generated encoder does: a build
// without the vtprotobuf tag leaves every response to protobuf-go.
// scripts/test.sh builds with the tag, so these run there.
func needGenerated(t testing.TB) {
	t.Helper()
	if !generatedEncoder {
		t.Skip("built without -tags vtprotobuf: protobuf-go encodes every response")
	}
}
