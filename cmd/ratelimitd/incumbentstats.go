package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/ratelimitd/ratelimitd/internal/incumbentstats"
	"github.com/ratelimitd/ratelimitd/internal/metrics"
)

// newIncumbentStats makes the counters of envoyproxy/ratelimit's stats when
// a sink wants them (--statsd-addr, --compat-metrics-addr), else nil.
func newIncumbentStats(ctx context.Context, s *settings, getenv func(string) string, m *metrics.Metrics, log *slog.Logger) (*incumbentstats.Stats, error) {
	st := &s.stats
	if st.opts.StatsdAddr == "" && st.compatAddr == "" {
		return nil, nil
	}
	opts := st.opts
	opts.OnSinkError, opts.Logger, opts.Getenv = m.StatsSinkError, log, getenv
	if st.mapper != "" {
		b, err := os.ReadFile(st.mapper)
		if err != nil {
			return nil, fmt.Errorf("--compat-metrics-mapper: %w", err)
		}
		opts.Mapping = string(b)
	}
	c, err := incumbentstats.New(ctx, opts)
	switch {
	case err != nil && st.mapper != "":
		return nil, fmt.Errorf("--compat-metrics-mapper %s: %w", st.mapper, err)
	case errors.Is(err, incumbentstats.ErrAddress):
		return nil, fmt.Errorf("--statsd-addr: %w", err)
	case err != nil:
		return nil, err
	}
	if opts.StatsdAddr != "" {
		log.Info("sending envoyproxy/ratelimit's stats to statsd", "addr", opts.StatsdAddr, "protocol", opts.StatsdProtocol, "every", opts.FlushInterval)
	}
	return c, nil
}

// serveIncumbentStats serves envoyproxy/ratelimit's stats as Prometheus metrics on
// addr until the returned stop is called.
func serveIncumbentStats(addr, path string, c *incumbentstats.Stats, log *slog.Logger) (stop func(), err error) {
	mux := http.NewServeMux()
	mux.Handle(path, promhttp.HandlerFor(c.Registry(), promhttp.HandlerOpts{ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelError)}))
	return serveAside("--compat-metrics-addr", addr, mux, log)
}
