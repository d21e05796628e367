package xds

import "github.com/prometheus/client_golang/prometheus"

// Metrics is the xDS client's collector. A nil *Metrics records nothing.
type Metrics struct {
	XDSConnected prometheus.Gauge
}

// NewMetrics makes the xDS client's collector and registers it on reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{XDSConnected: prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "ratelimitd_xds_connected",
		Help: "1 while the stream to the xDS management server (--xds-server) is open; the rules in force stay while it is not.",
	})}
	reg.MustRegister(m.XDSConnected)
	return m
}

// XDSStream records whether the xDS stream is open.
func (m *Metrics) XDSStream(open bool) {
	if m == nil {
		return
	}
	v := 0.0
	if open {
		v = 1
	}
	m.XDSConnected.Set(v)
}
