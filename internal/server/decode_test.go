package server

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"strings"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/ratelimitd/ratelimitd/internal/service"
)

// TestDecodeRequestMatchesProtobuf holds decodeRequest to proto.Unmarshal
// over random requests — what Envoy sends, and what it never does (limit
// overrides, fields repeated, unknown fields, text that is not UTF-8,
// cut short, bytes flipped): whatever it takes it must decode to the very
// message protobuf decodes, and whatever protobuf refuses it must not
// take. It must take what Envoy sends.
func TestDecodeRequestMatchesProtobuf(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	taken, plain := 0, 0
	for i := range 30000 {
		req, envoyShaped := randomRequest(rng)
		b, err := proto.Marshal(req)
		if err != nil {
			t.Fatal(err)
		}
		b = mangle(rng, b)
		want := &rlsv3.RateLimitRequest{}
		wantErr := proto.Unmarshal(b, want)
		got := &rlsv3.RateLimitRequest{HitsAddend: 7} // decodeRequest resets it
		if !decodeRequest(b, got) {
			if envoyShaped && len(b) > 0 && wantErr == nil && proto.Equal(want, req) {
				t.Fatalf("case %d: Envoy's request %v not taken", i, req)
			}
			continue
		}
		taken++
		if envoyShaped {
			plain++
		}
		if wantErr != nil {
			t.Fatalf("case %d: taken %x, which protobuf refuses: %v", i, b, wantErr)
		}
		if !proto.Equal(got, want) {
			t.Fatalf("case %d: %x decoded as\n%v\nprotobuf:\n%v", i, b, got, want)
		}
	}
	t.Logf("%d of 30000 taken (%d of Envoy's shape)", taken, plain)
	if plain < 10000 {
		t.Errorf("only %d requests of Envoy's shape taken", plain)
	}
}

// randomRequest returns a request and whether it is of the shape Envoy
// sends (entries, hits_addend at either level, is_negative_hits).
func randomRequest(rng *rand.Rand) (*rlsv3.RateLimitRequest, bool) {
	texts := []string{"", "d0", "remote_address", "10.0.0.1", "ünï©ødé", "a longer value of a header, say a user agent string"}
	req := &rlsv3.RateLimitRequest{Domain: texts[rng.IntN(len(texts))]}
	if rng.IntN(3) == 0 {
		req.HitsAddend = rng.Uint32N(5000)
	}
	envoy := true
	for range rng.IntN(5) {
		d := &rlv3.RateLimitDescriptor{}
		for range rng.IntN(4) {
			d.Entries = append(d.Entries, &rlv3.RateLimitDescriptor_Entry{Key: texts[rng.IntN(len(texts))], Value: texts[rng.IntN(len(texts))]})
		}
		if rng.IntN(4) == 0 {
			d.HitsAddend = wrapperspb.UInt64(rng.Uint64N(1 << 40))
		}
		d.IsNegativeHits = rng.IntN(6) == 0
		if rng.IntN(8) == 0 {
			d.Limit = &rlv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 5, Unit: typev3.RateLimitUnit_MINUTE}
			envoy = false
		}
		req.Descriptors = append(req.Descriptors, d)
	}
	return req, envoy
}

// mangle sometimes spoils b: cut short, a byte flipped, an unknown field
// or a descriptor's hits_addend given twice (merged), invalid UTF-8 spliced in (a
// domain, an entry).
func mangle(rng *rand.Rand, b []byte) []byte {
	switch rng.IntN(12) {
	case 0:
		if len(b) > 0 {
			return b[:rng.IntN(len(b))]
		}
	case 1:
		if len(b) > 0 {
			c := append([]byte(nil), b...)
			c[rng.IntN(len(c))] ^= byte(1 + rng.IntN(255))
			return c
		}
	case 2:
		return protowire.AppendVarint(protowire.AppendTag(append([]byte(nil), b...), 9, protowire.VarintType), 1)
	case 3:
		// {value: 11} then {}: protobuf merges the two (11 stays), where
		// "the last replaces" would make it 0.
		d := protowire.AppendTag(nil, descHitsAddend, protowire.BytesType)
		d = protowire.AppendBytes(d, protowire.AppendVarint(protowire.AppendTag(nil, wrapperValue, protowire.VarintType), 11))
		d = protowire.AppendBytes(protowire.AppendTag(d, descHitsAddend, protowire.BytesType), nil)
		return protowire.AppendBytes(protowire.AppendTag(append([]byte(nil), b...), reqDescriptors, protowire.BytesType), d)
	case 4:
		return protowire.AppendString(protowire.AppendTag(append([]byte(nil), b...), reqDomain, protowire.BytesType), "\xff\xfe")
	case 5:
		e := protowire.AppendString(protowire.AppendTag(nil, entryValue, protowire.BytesType), "v\xff")
		d := protowire.AppendBytes(protowire.AppendTag(nil, descEntries, protowire.BytesType), e)
		return protowire.AppendBytes(protowire.AppendTag(append([]byte(nil), b...), reqDescriptors, protowire.BytesType), d)
	case 6:
		// A metadata-like field of another message type: unknown here.
		md, _ := proto.Marshal(&corev3.Metadata{})
		return protowire.AppendBytes(protowire.AppendTag(append([]byte(nil), b...), 4, protowire.BytesType), md)
	}
	return b
}

// BenchmarkDecodeRequest: a request as Envoy sends it, of 1 and 3
// descriptors, by decodeRequest and by proto.Unmarshal.
// go test -run XXX -bench DecodeRequest -benchmem ./internal/server/
func BenchmarkDecodeRequest(b *testing.B) {
	for _, n := range []int{1, 3} {
		req := &rlsv3.RateLimitRequest{Domain: "bench"}
		for i := range n {
			req.Descriptors = append(req.Descriptors, &rlv3.RateLimitDescriptor{Entries: []*rlv3.RateLimitDescriptor_Entry{
				{Key: "d" + string(rune('0'+i)), Value: "value-12345"},
			}})
		}
		data, _ := proto.Marshal(req)
		b.Run("descriptors="+string(rune('0'+n))+"/decodeRequest", func(b *testing.B) {
			for b.Loop() {
				if !decodeRequest(data, &rlsv3.RateLimitRequest{}) {
					b.Fatal("not taken")
				}
			}
		})
		b.Run("descriptors="+string(rune('0'+n))+"/proto.Unmarshal", func(b *testing.B) {
			for b.Loop() {
				if err := proto.Unmarshal(data, &rlsv3.RateLimitRequest{}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// echoDecider keeps the last request it was asked and answers resp.
type echoDecider struct {
	*service.Service
	got  chan *rlsv3.RateLimitRequest
	resp *rlsv3.RateLimitResponse
}

func (e *echoDecider) ShouldRateLimit(ctx context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	e.got <- req
	return e.resp, nil
}

// TestCodecOverGRPC: through a real gRPC connection the service gets
// exactly the request sent, whether decodeRequest takes it (Envoy's
// shape), leaves it to protobuf (a limit override), or it arrives in
// several buffers (a request of about 200 KB); the caller gets exactly
// the response the service gave, whether the generated code writes it or
// protobuf-go does (dynamic metadata); health checks, another service's
// messages, still work.
func TestCodecOverGRPC(t *testing.T) {
	meta, _ := structpb.NewStruct(map[string]any{"k": "v"})
	rng := rand.New(rand.NewPCG(9, 10))
	dec := &echoDecider{Service: newService(t), got: make(chan *rlsv3.RateLimitRequest, 1)}
	srv := New(dec, Options{})
	gl, _ := net.Listen("tcp", "127.0.0.1:0")
	hl, _ := net.Listen("tcp", "127.0.0.1:0")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx, gl, hl) }()
	defer func() { cancel(); <-done }()
	cc, err := grpc.NewClient(gl.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	plain := &rlsv3.RateLimitRequest{Domain: "d", HitsAddend: 3, Descriptors: []*rlv3.RateLimitDescriptor{
		{Entries: []*rlv3.RateLimitDescriptor_Entry{{Key: "k", Value: "v"}, {Key: "path", Value: "/ü"}}},
		{Entries: []*rlv3.RateLimitDescriptor_Entry{{Key: "k", Value: "w"}}, HitsAddend: wrapperspb.UInt64(1 << 33)},
	}}
	override := proto.Clone(plain).(*rlsv3.RateLimitRequest)
	override.Descriptors[0].Limit = &rlv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 5, Unit: typev3.RateLimitUnit_MINUTE}
	large := &rlsv3.RateLimitRequest{Domain: "d"}
	for i := range 200 {
		large.Descriptors = append(large.Descriptors, &rlv3.RateLimitDescriptor{Entries: []*rlv3.RateLimitDescriptor_Entry{
			{Key: fmt.Sprint("k", i), Value: strings.Repeat("x", 1000)},
		}})
	}
	client := rlsv3.NewRateLimitServiceClient(cc)
	for name, req := range map[string]*rlsv3.RateLimitRequest{"plain": plain, "override": override, "large": large} {
		for i := range 20 {
			dec.resp = randomResponse(rng)
			if i%4 == 0 {
				dec.resp.DynamicMetadata = meta
			}
			resp, err := client.ShouldRateLimit(context.Background(), req)
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			if got := <-dec.got; !proto.Equal(got, req) {
				t.Fatalf("%s: the service got\n%v\nwant\n%v", name, got, req)
			}
			if !proto.Equal(resp, dec.resp) {
				t.Fatalf("%s: the caller got\n%v\nwant\n%v", name, resp, dec.resp)
			}
		}
	}
	if r, err := healthpb.NewHealthClient(cc).Check(context.Background(), &healthpb.HealthCheckRequest{}); err != nil || r.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Errorf("health check through the codec: %v, %v", r, err)
	}
}
