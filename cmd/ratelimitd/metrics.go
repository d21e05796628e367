package main

import (
	"github.com/ratelimitd/ratelimitd/internal/global"
	"github.com/ratelimitd/ratelimitd/internal/lease"
	"github.com/ratelimitd/ratelimitd/internal/metrics"
	"github.com/ratelimitd/ratelimitd/internal/redisstore"
	"github.com/ratelimitd/ratelimitd/internal/rlqs"
	"github.com/ratelimitd/ratelimitd/internal/xds"
)

// allMetrics are the process's collectors and each room's, all on the
// one registry /metrics serves. Every room's are registered whether or
// not the room runs, so the names a dashboard reads are always there.
type allMetrics struct {
	*metrics.Metrics
	store  *redisstore.Metrics
	lease  *lease.Metrics
	global *global.Metrics
	rlqs   *rlqs.Metrics
	xds    *xds.Metrics
}

// newMetrics registers every collector of the process.
func newMetrics(version string) *allMetrics {
	m := metrics.New(version)
	return &allMetrics{Metrics: m, store: redisstore.NewMetrics(m.Registry), lease: lease.NewMetrics(m.Registry),
		rlqs: rlqs.NewMetrics(m.Registry), xds: xds.NewMetrics(m.Registry), global: global.NewMetrics(m.Registry)}
}
