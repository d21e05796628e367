package server

import (
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
)

// requestCodec is the gRPC server's codec: a RateLimitRequest is read by
// decodeRequest when it takes it (what Envoy sends, with a fifth to a
// third of protobuf-go's allocations); every other message, every reply,
// and any request it does not take go through gRPC's own protobuf codec.
type requestCodec struct{ encoding.CodecV2 }

// Unmarshal reads v from data.
func (c requestCodec) Unmarshal(data mem.BufferSlice, v any) error {
	if m, ok := v.(*rlsv3.RateLimitRequest); ok {
		// decodeRequest copies what it keeps: the buffers may be reused
		// once this returns.
		if len(data) == 1 {
			if decodeRequest(data[0].ReadOnlyData(), m) {
				return nil
			}
		} else {
			buf := data.MaterializeToBuffer(mem.DefaultBufferPool())
			ok := decodeRequest(buf.ReadOnlyData(), m)
			buf.Free()
			if ok {
				return nil
			}
		}
	}
	return c.CodecV2.Unmarshal(data, v)
}

// codecOption is the server option that installs requestCodec.
func codecOption() grpc.ServerOption {
	return grpc.ForceServerCodecV2(requestCodec{encoding.GetCodecV2(proto.Name)})
}
