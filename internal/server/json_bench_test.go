package server

import (
	"context"
	"net/http/httptest"
	"strings"
	"testing"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/ratelimitd/ratelimitd/internal/service"
)

// okDecider answers every request with a status like the service's, so
// the benchmark measures /json's own cost.
type okDecider struct{ *service.Service }

func (okDecider) ShouldRateLimit(context.Context, *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	return &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK, Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{{
		Code: rlsv3.RateLimitResponse_OK, LimitRemaining: 99, DurationUntilReset: durationpb.New(42e9),
		CurrentLimit: &rlsv3.RateLimitResponse_RateLimit{RequestsPerUnit: 100, Unit: rlsv3.RateLimitResponse_RateLimit_MINUTE},
	}}}, nil
}

// BenchmarkJSON: one /json request of one descriptor, body read to
// response written, the decision itself excluded.
func BenchmarkJSON(b *testing.B) {
	srv := New(okDecider{newService(b)}, Options{})
	b.Cleanup(srv.grpc.Stop)
	h := srv.httpHandler()
	body := `{"domain":"example","descriptors":[{"entries":[{"key":"remote_address","value":"10.0.0.1"}]}]}`
	b.ReportAllocs()
	for b.Loop() {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest("POST", "/json", strings.NewReader(body)))
		if rec.Code != 200 {
			b.Fatal(rec.Code, rec.Body.String())
		}
	}
}
