package rlqs

import (
	"errors"
	"io"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// StreamRateLimitQuotas serves one Envoy's stream: each usage report is
// answered with the assignments it calls for, and grants for a new
// window are pushed when it starts.
func (s *Server) StreamRateLimitQuotas(stream grpc.BidiStreamingServer[rlqsv3.RateLimitQuotaUsageReports, rlqsv3.RateLimitQuotaResponse]) error {
	ss, err := s.NewSession()
	if err != nil {
		return status.Error(codes.ResourceExhausted, err.Error())
	}
	defer ss.Close()
	ctx := stream.Context()
	msgs, errc := make(chan *rlqsv3.RateLimitQuotaUsageReports), make(chan error, 1)
	go func() {
		for {
			m, err := stream.Recv()
			if err != nil {
				errc <- err
				return
			}
			select {
			case msgs <- m:
			case <-ctx.Done():
				return
			}
		}
	}()
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		wait := time.Hour
		if w := ss.NextWake(); !w.IsZero() {
			wait = max(0, w.Sub(s.opts.Now()))
		}
		timer.Reset(wait)
		var resp *rlqsv3.RateLimitQuotaResponse
		select {
		case <-ctx.Done():
			return status.FromContextError(ctx.Err()).Err()
		case <-s.done:
			return status.Error(codes.Unavailable, "rlqs: server shutting down")
		case err := <-errc:
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		case m := <-msgs:
			if resp, err = ss.Report(ctx, s.opts.Now(), m); err != nil {
				s.log.Warn("rlqs: stream refused", "err", err)
				return status.Error(codes.InvalidArgument, err.Error())
			}
		case <-timer.C:
			resp = ss.Wake(ctx, s.opts.Now())
		}
		if resp != nil {
			if err := stream.Send(resp); err != nil {
				return err
			}
		}
	}
}
