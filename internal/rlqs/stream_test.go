package rlqs_test

import (
	"context"
	"net"
	"sync/atomic"
	"testing"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/ratelimitd/ratelimitd/config"
	"github.com/ratelimitd/ratelimitd/internal/redisstore"
	"github.com/ratelimitd/ratelimitd/internal/redisstore/redistest"
	"github.com/ratelimitd/ratelimitd/internal/rlqs"
	"github.com/ratelimitd/ratelimitd/internal/rlqs/rlqstest"
	"github.com/ratelimitd/ratelimitd/internal/service"
)

// TestStreamHandler runs the gRPC handler on real time, with the store's
// and the server's clock shifted to 2.5 s before a minute ends: the
// first grant's assignment lasts 1 s (the window's rest less the margin,
// in whole seconds), and when the window ends the handler's timer pushes
// the next window's grant without waiting for a report (the Envoy's next
// one is due 2.5 s later). A report without
// a domain ends the stream with INVALID_ARGUMENT; Stop ends the others
// with UNAVAILABLE.
func TestStreamHandler(t *testing.T) {
	// The clock runs 2.5 s before a minute's end from the first request
	// on (set again there: a busy machine may take seconds to start the
	// servers, and a grant asked within the margin of the end is none).
	var end time.Time
	var shift atomic.Int64
	aim := func() {
		real := time.Now()
		end = real.Truncate(time.Minute).Add(time.Minute)
		shift.Store(int64(end.Add(-2500 * time.Millisecond).Sub(real)))
	}
	aim()
	clock := func() time.Time { return time.Now().Add(time.Duration(shift.Load())) }

	redis := redistest.Start(t)
	store, err := redisstore.New(redisstore.Options{URL: redis.URL(), Timeout: time.Second, ScriptTime: clock})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	snap, err := config.Parse("rules.yaml", []byte("domain: edge\nrlqs: {descriptor_keys: [tenant]}\ndescriptors:\n  - key: tenant\n    rate_limit: {unit: minute, requests_per_unit: 6000}\n"))
	if err != nil {
		t.Fatal(err)
	}
	srv := rlqs.New(service.New(snap, store, nil, service.Options{}), store, rlqs.Options{Now: clock})
	g := grpc.NewServer()
	srv.Register(g)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go g.Serve(lis)
	defer g.Stop()
	cc, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	e := rlqstest.New(rlqstest.Strict("edge"), rlqstest.GRPC(ctx, cc))
	defer e.Close()
	id := map[string]string{"tenant": "acme"}
	aim()
	e.Request(clock(), id)
	waitFor := func(what string, within time.Duration, ok func() bool) {
		t.Helper()
		deadline := time.Now().Add(within)
		for !ok() {
			if time.Now().After(deadline) {
				t.Fatalf("%s: not within %v (stats %+v, strategy %s)", what, within, e.Stats(), e.Strategy(id))
			}
			time.Sleep(10 * time.Millisecond)
			e.Tick(clock())
		}
	}
	waitFor("the first grant", 2*time.Second, func() bool { return e.Strategy(id) == "token_bucket" })
	first := e.Stats().Responses
	// The first assignment expires before the window ends (strict: denied
	// then), and the window's end brings the next grant unasked.
	waitFor("the next window's grant", 8*time.Second, func() bool {
		return e.Stats().Responses > first && e.Strategy(id) == "token_bucket" && !clock().Before(end)
	})
	if r := e.Stats().Reports; r != 1 {
		t.Errorf("%d reports sent by the next window's grant, want only the first: it was not pushed", r)
	}

	// A report without a domain first ends the stream.
	bad, err := rlqsv3.NewRateLimitQuotaServiceClient(cc).StreamRateLimitQuotas(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := bad.Send(&rlqsv3.RateLimitQuotaUsageReports{}); err != nil {
		t.Fatal(err)
	}
	if _, err := bad.Recv(); status.Code(err) != codes.InvalidArgument {
		t.Errorf("a report without a domain: %v, want InvalidArgument", err)
	}

	// Stop ends the open streams.
	other, err := rlqsv3.NewRateLimitQuotaServiceClient(cc).StreamRateLimitQuotas(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := other.Send(&rlqsv3.RateLimitQuotaUsageReports{Domain: "edge"}); err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	go func() { _, err := other.Recv(); got <- err }()
	srv.Stop()
	select {
	case err := <-got:
		if status.Code(err) != codes.Unavailable {
			t.Errorf("after Stop: %v, want Unavailable", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a stream outlived Stop by 5 s")
	}
}
