package main

import (
	"context"
	"io"
	"log/slog"
	"testing"

	"go.opentelemetry.io/otel/trace/noop"

	"github.com/ratelimitd/ratelimitd/internal/limit"
	"github.com/ratelimitd/ratelimitd/internal/redisstore/redistest"
	"github.com/ratelimitd/ratelimitd/internal/service"
)

// TestAssembledStoreKeepsCharges: the store the service is handed, as
// assembled (leases over Redis, with a per-second Redis, with a home of
// global limits), keeps a usage charge the caller had no time to send:
// the service finds the charge journal through every layer.
func TestAssembledStoreKeepsCharges(t *testing.T) {
	srv, fast, home := redistest.Start(t), redistest.Start(t), redistest.Start(t)
	for name, extra := range map[string][]string{
		"leases":     nil,
		"per-second": {"--redis-persecond-url", fast.URL()},
		"global":     {"--global-redis-url", home.URL()},
	} {
		t.Run(name, func(t *testing.T) {
			args := append([]string{"--config", "../../deploy/rules", "--redis-url", srv.URL()}, extra...)
			s, err := parseSettings(args, env(nil), io.Discard)
			if err != nil {
				t.Fatal(err)
			}
			st, closeStore, err := newStore(context.Background(), s, nil, noop.NewTracerProvider().Tracer(""), newMetrics("test"), slog.New(slog.DiscardHandler))
			if err != nil {
				t.Fatal(err)
			}
			defer closeStore()
			k, ok := st.(service.ChargeKeeper)
			if !ok {
				t.Fatalf("%T keeps no charges", st)
			}
			charge := limit.Check{Key: "keep:" + name, Limit: 100, WindowUS: 3600e6, Hits: 5, Usage: true}
			if !k.KeepCharges([]limit.Check{charge}) {
				t.Errorf("%T did not keep a usage charge", st)
			}
		})
	}
}
