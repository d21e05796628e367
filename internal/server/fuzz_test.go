package server

import (
	"bytes"
	"math/rand/v2"
	"testing"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/proto"
)

// The fuzz targets hold the codec to protobuf-go on any input. The seed
// corpus is testdata/fuzz; ./scripts/test.sh runs each a few seconds, and
// at length:
//
//	go test -run XXX -fuzz FuzzDecodeRequest -fuzztime 30m ./internal/server
//	go test -run XXX -fuzz FuzzEncodeResponse -fuzztime 30m ./internal/server

// FuzzDecodeRequest: whatever decodeRequest takes, protobuf-go decodes to
// the very same message, and it stays so when the input is overwritten
// (gRPC reuses its buffer); whatever protobuf-go refuses, decodeRequest
// does not take.
func FuzzDecodeRequest(f *testing.F) {
	rng := rand.New(rand.NewPCG(13, 14))
	for range 16 {
		req, _ := randomRequest(rng)
		b, _ := proto.Marshal(req)
		f.Add(mangle(rng, b))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		want := &rlsv3.RateLimitRequest{}
		wantErr := proto.Unmarshal(b, want)
		in := bytes.Clone(b)
		got := &rlsv3.RateLimitRequest{}
		if !decodeRequest(in, got) {
			return
		}
		if wantErr != nil {
			t.Fatalf("taken %x, which protobuf refuses: %v", b, wantErr)
		}
		for i := range in {
			in[i] = ^in[i]
		}
		if !proto.Equal(got, want) {
			t.Fatalf("%x decoded as\n%v\nprotobuf:\n%v", b, got, want)
		}
	})
}

// FuzzEncodeResponse: whatever response marshalResponse takes (one
// protobuf-go reads from the input), it writes byte for byte what
// proto.Marshal writes.
func FuzzEncodeResponse(f *testing.F) {
	needGenerated(f)
	rng := rand.New(rand.NewPCG(15, 16))
	for range 16 {
		b, _ := proto.Marshal(randomResponse(rng))
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		resp := &rlsv3.RateLimitResponse{}
		if proto.Unmarshal(b, resp) != nil {
			return
		}
		got, ok := marshalResponse(resp)
		if !ok {
			return
		}
		want, err := proto.Marshal(resp)
		if err != nil {
			t.Fatalf("taken %v, which protobuf refuses: %v", resp, err)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("%v written as %x, protobuf: %x", resp, got, want)
		}
	})
}
