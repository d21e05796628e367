package rlqstest

import (
	"context"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"google.golang.org/grpc"
)

// Conn is an open RLQS stream, as far as the client sends on it.
type Conn interface {
	Send(*rlqsv3.RateLimitQuotaUsageReports) error
	Close()
}

// Dialer opens a stream. The transport hands what the server sends to
// deliver, and the stream's end to closed, in order, from any goroutine.
type Dialer func(deliver func(*rlqsv3.RateLimitQuotaResponse), closed func(error)) (Conn, error)

// GRPC returns a Dialer of streams on cc; ctx ends them.
func GRPC(ctx context.Context, cc grpc.ClientConnInterface) Dialer {
	client := rlqsv3.NewRateLimitQuotaServiceClient(cc)
	return func(deliver func(*rlqsv3.RateLimitQuotaResponse), closed func(error)) (Conn, error) {
		sctx, cancel := context.WithCancel(ctx)
		stream, err := client.StreamRateLimitQuotas(sctx)
		if err != nil {
			cancel()
			return nil, err
		}
		go func() {
			for {
				resp, err := stream.Recv()
				if err != nil {
					cancel()
					closed(err)
					return
				}
				deliver(resp)
			}
		}()
		return &grpcConn{stream: stream, cancel: cancel}, nil
	}
}

type grpcConn struct {
	stream grpc.BidiStreamingClient[rlqsv3.RateLimitQuotaUsageReports, rlqsv3.RateLimitQuotaResponse]
	cancel context.CancelFunc
}

func (c *grpcConn) Send(r *rlqsv3.RateLimitQuotaUsageReports) error { return c.stream.Send(r) }
func (c *grpcConn) Close()                                          { c.cancel() }
