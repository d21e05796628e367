package main

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ratelimitd/ratelimitd/internal/redisstore/redistest"
	"github.com/ratelimitd/ratelimitd/internal/rlqs/rlqstest"
)

const rlqsRules = `domain: edge
rlqs: {descriptor_keys: [tenant]}
descriptors:
  - key: tenant
    rate_limit: {unit: hour, requests_per_unit: 3600}
`

// TestRLQS: with --rlqs, a simulated Envoy over gRPC (strict
// configuration) is denied until its first assignment, then admits from a
// token bucket holding a grant taken from the very counter ShouldRateLimit
// decides on; a shutdown ends its stream instead of waiting on it.
func TestRLQS(t *testing.T) {
	redistest.AwayFromHourEnd(time.Minute)
	srv := redistest.Start(t)
	rules := writeRules(t, rlqsRules)
	in := start(t, env(nil), "--config", rules, "--redis-url", srv.URL(), "--redis-timeout", "2s", "--rlqs")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	e := rlqstest.New(rlqstest.Strict("edge"), rlqstest.GRPC(ctx, dial(t, in.grpcAddr)))
	defer e.Close()
	id := map[string]string{"tenant": "acme", "env": "prod"}
	if e.Request(time.Now(), id) {
		t.Fatal("first request allowed before any assignment (strict: DENY_ALL)")
	}
	eventuallyWithin(t, 5*time.Second, "a token bucket assigned", func() error {
		e.Tick(time.Now())
		if s := e.Strategy(id); s != "token_bucket" {
			return fmt.Errorf("strategy %s", s)
		}
		return nil
	})
	granted := int(e.Tokens(id))
	// An even share of the rule's rate for two report periods (1 a
	// second for 10 s), or what the first report asked for.
	if granted != 10 {
		t.Errorf("first grant %d hits, want 10", granted)
	}
	allowed := 0
	for range granted + 5 {
		if e.Request(time.Now(), id) {
			allowed++
		}
	}
	if allowed != granted {
		t.Errorf("%d allowed from a grant of %d", allowed, granted)
	}
	resp, err := rlsv3.NewRateLimitServiceClient(dial(t, in.grpcAddr)).ShouldRateLimit(ctx,
		&rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*rlcommon.RateLimitDescriptor{desc("tenant", "acme")}})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := resp.GetStatuses()[0].GetLimitRemaining(), uint32(3600-granted-1); got != want {
		t.Errorf("ShouldRateLimit remaining %d, want %d: RLQS and RLS counters are apart", got, want)
	}
	if got := scrape(t, in.httpAddr, "ratelimitd_rlqs_streams"); got != "1" {
		t.Errorf("ratelimitd_rlqs_streams = %q, want 1", got)
	}
	if got := scrape(t, in.httpAddr, `ratelimitd_rlqs_assignments_total{kind="token_bucket"}`); got != "1" {
		t.Errorf("token_bucket assignments = %q, want 1", got)
	}
	began := time.Now()
	if err := in.stop(); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(began); d > 8*time.Second {
		t.Errorf("shutdown took %v with an RLQS stream open: it waited on the stream", d)
	}
}

// TestRLQSOff: without --rlqs the service is not served.
func TestRLQSOff(t *testing.T) {
	in := start(t, env(nil), "--config", writeRules(t, rlqsRules))
	// Bounded: a served RLQS would keep the stream open.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	stream, err := rlqsv3.NewRateLimitQuotaServiceClient(dial(t, in.grpcAddr)).StreamRateLimitQuotas(ctx)
	if err == nil {
		_ = stream.Send(&rlqsv3.RateLimitQuotaUsageReports{Domain: "edge"})
		_, err = stream.Recv()
	}
	if status.Code(err) != codes.Unimplemented {
		t.Errorf("RLQS without --rlqs: %v, want Unimplemented", err)
	}
}

// TestRLQSFlags: bad --rlqs-* values are startup errors naming the flag.
func TestRLQSFlags(t *testing.T) {
	rules := writeRules(t, rlqsRules)
	for _, tt := range []struct{ flag, value, want string }{
		{"--rlqs-max-streams", "0", "-rlqs-max-streams"},
		{"--rlqs-max-buckets", "-1", "-rlqs-max-buckets"},
		{"--rlqs-margin", "0s", "-rlqs-margin"},
		{"--rlqs-idle-after", "1s", "--rlqs-idle-after 1s"},
	} {
		// Bounded: a value wrongly accepted starts a server, which the
		// deadline stops, and the nil error fails the test.
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		err := run(ctx, []string{"--config", rules, "--rlqs", tt.flag, tt.value, "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0"}, env(nil), &syncBuffer{}, &syncBuffer{})
		cancel()
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s %s: %v, want an error naming it", tt.flag, tt.value, err)
		}
	}
}
