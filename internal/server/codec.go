package server

import (
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
)

// rlsCodec is the gRPC server's codec: a RateLimitRequest is read by
// decodeRequest when it takes it (what Envoy sends, with a fifth to a
// third of protobuf-go's allocations), a RateLimitResponse written by
// appendResponse when responseSize takes it (what the service sets);
// every other message, and anything those leave, goes through gRPC's own
// protobuf codec.
type rlsCodec struct{ encoding.CodecV2 }

// Marshal writes v.
func (c rlsCodec) Marshal(v any) (mem.BufferSlice, error) {
	if resp, ok := v.(*rlsv3.RateLimitResponse); ok {
		if n, ok := responseSize(resp); ok {
			return mem.BufferSlice{mem.SliceBuffer(appendResponse(make([]byte, 0, n), resp))}, nil
		}
	}
	return c.CodecV2.Marshal(v)
}

// Unmarshal reads v from data.
func (c rlsCodec) Unmarshal(data mem.BufferSlice, v any) error {
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

// codecOption is the server option that installs rlsCodec.
func codecOption() grpc.ServerOption {
	return grpc.ForceServerCodecV2(rlsCodec{encoding.GetCodecV2(proto.Name)})
}
