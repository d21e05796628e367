package server

import (
	"fmt"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	protobuf "google.golang.org/protobuf/proto"
)

// rlsCodec is the gRPC server's codec: a RateLimitRequest is read by
// decodeRequest when it takes it (what Envoy sends, with a fifth to a
// third of protobuf-go's allocations), a RateLimitResponse written by
// go-control-plane's generated code when marshalResponse takes it (what
// the service sets);
// every other message, and anything those leave, goes through gRPC's own
// protobuf codec.
type rlsCodec struct{ encoding.CodecV2 }

// Marshal writes v.
func (c rlsCodec) Marshal(v any) (mem.BufferSlice, error) {
	// A nil message goes to gRPC's codec, which writes an empty one.
	if resp, ok := v.(*rlsv3.RateLimitResponse); ok && resp != nil {
		if b, ok := marshalResponse(resp); ok {
			return mem.BufferSlice{mem.SliceBuffer(b)}, nil
		}
	}
	return c.CodecV2.Marshal(v)
}

// Unmarshal reads v from data.
func (c rlsCodec) Unmarshal(data mem.BufferSlice, v any) error {
	if pm, ok := v.(protobuf.Message); ok && !pm.ProtoReflect().IsValid() {
		// protobuf-go would panic writing into a nil message.
		return fmt.Errorf("server: unmarshal into a nil %T", v)
	}
	m, ok := v.(*rlsv3.RateLimitRequest)
	if !ok {
		return c.CodecV2.Unmarshal(data, v)
	}
	// One buffer comes back as itself, with no copy; decodeRequest copies
	// the text it keeps, as the buffers are reused once this returns.
	buf := data.MaterializeToBuffer(mem.DefaultBufferPool())
	defer buf.Free()
	if decodeRequest(buf.ReadOnlyData(), m) {
		return nil
	}
	return protobuf.Unmarshal(buf.ReadOnlyData(), m)
}

// codecOption is the server option that installs rlsCodec.
func codecOption() grpc.ServerOption {
	return grpc.ForceServerCodecV2(rlsCodec{encoding.GetCodecV2(proto.Name)})
}
