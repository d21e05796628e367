package server

import (
	"math/rand/v2"
	"runtime"
	"strings"
	"testing"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/encoding"
	gproto "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

func testCodec() rlsCodec { return rlsCodec{encoding.GetCodecV2(gproto.Name)} }

// TestDecodedTextOwnsItsMemory: a decoded request stays what it was when
// the buffer it came from is overwritten (gRPC reuses it once Unmarshal
// returns), for requests whose text is shared in one copy and for those
// whose strings each have their own.
func TestDecodedTextOwnsItsMemory(t *testing.T) {
	rng := rand.New(rand.NewPCG(11, 12))
	for i := range 5000 {
		req, _ := randomRequest(rng)
		if i%2 == 0 && len(req.Descriptors) > 0 {
			// Past compactText: each string its own copy.
			req.Descriptors[0].Entries = append(req.Descriptors[0].Entries,
				&rlv3.RateLimitDescriptor_Entry{Key: "big", Value: strings.Repeat("v", compactText)})
		}
		b, err := proto.Marshal(req)
		if err != nil {
			t.Fatal(err)
		}
		got := &rlsv3.RateLimitRequest{}
		if !decodeRequest(b, got) {
			continue
		}
		for j := range b {
			b[j] = 0xAA
		}
		if !proto.Equal(got, req) {
			t.Fatalf("case %d: after its buffer was overwritten the request reads\n%v\nwant\n%v", i, got, req)
		}
	}
}

// TestKeptNamesHoldNoRequest: keeping a decoded request's strings (as the
// incumbent's stats keep unknown domain names) keeps none of the rest of
// the message: 100 requests of 1 MiB, each a 1 MiB domain shadowed by a
// short one (protobuf's last one wins) and a 1 MiB entry beside a short
// one, leave the heap within 8 MB of where it was.
func TestKeptNamesHoldNoRequest(t *testing.T) {
	big := strings.Repeat("x", 1<<20)
	var kept []string
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	c := testCodec()
	for i := range 100 {
		b := protowire.AppendString(protowire.AppendTag(nil, reqDomain, protowire.BytesType), big)
		b = protowire.AppendString(protowire.AppendTag(b, reqDomain, protowire.BytesType), "unknown-domain")
		req := &rlsv3.RateLimitRequest{Descriptors: []*rlv3.RateLimitDescriptor{{Entries: []*rlv3.RateLimitDescriptor_Entry{
			{Key: "k", Value: "v"}, {Key: "large", Value: big},
		}}}}
		tail, _ := proto.Marshal(req)
		b = append(b, tail...)
		m := &rlsv3.RateLimitRequest{}
		if err := c.Unmarshal(mem.BufferSlice{mem.SliceBuffer(b)}, m); err != nil {
			t.Fatal(err)
		}
		if m.Domain != "unknown-domain" || len(m.Descriptors) != 1 {
			t.Fatalf("request %d decoded as domain %.20q, %d descriptors", i, m.Domain, len(m.Descriptors))
		}
		e := m.Descriptors[0].Entries[0]
		kept = append(kept, m.Domain, e.Key, e.Value)
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	if grown := int64(after.HeapAlloc) - int64(before.HeapAlloc); grown > 8<<20 {
		t.Fatalf("the heap grew by %d MB keeping %d short strings of 100 requests of 2 MiB", grown>>20, len(kept))
	}
	runtime.KeepAlive(kept)
}

// TestCodecNilMessages: a nil request or response is never dereferenced:
// a nil response goes to gRPC's own codec (an empty message), decoding
// into a nil message is an error.
func TestCodecNilMessages(t *testing.T) {
	c := testCodec()
	var resp *rlsv3.RateLimitResponse
	got, err := c.Marshal(resp)
	want, wantErr := c.CodecV2.Marshal(resp)
	if (err == nil) != (wantErr == nil) || string(got.Materialize()) != string(want.Materialize()) {
		t.Fatalf("a nil response: %x, %v; gRPC's codec: %x, %v", got.Materialize(), err, want.Materialize(), wantErr)
	}
	// Into a nil message gRPC's codec panics; this one says so.
	data, _ := proto.Marshal(&rlsv3.RateLimitRequest{Domain: "d"})
	for _, m := range []any{(*rlsv3.RateLimitRequest)(nil), (*rlsv3.RateLimitResponse)(nil)} {
		if err := c.Unmarshal(mem.BufferSlice{mem.SliceBuffer(data)}, m); err == nil || !strings.Contains(err.Error(), "nil") {
			t.Errorf("into a nil %T: %v, want an error", m, err)
		}
	}
}
