package main

import (
	"context"
	"crypto/tls"
	"errors"
	"log/slog"
	"net"
	"sync"

	"github.com/ratelimitd/ratelimitd/config"
	"github.com/ratelimitd/ratelimitd/internal/tlsverify"
	"github.com/ratelimitd/ratelimitd/internal/xds"
)

// xdsTLS is the client TLS config for --xds-server, nil for plaintext.
// The certificate and CA are id's, so they reload like the others.
func xdsTLS(x *xdsSettings, id *identity) *tls.Config {
	if !x.tls && id == nil && x.serverName == "" {
		return nil
	}
	c := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: x.serverName}
	if id != nil && id.certFile != "" {
		c.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return id.clientCert(), nil }
	}
	if id != nil && id.caFile != "" {
		name := x.serverName
		if name == "" {
			name, _, _ = net.SplitHostPort(x.opts.Server)
		}
		c.InsecureSkipVerify = true // replaced by VerifyConnection, which runs on every handshake
		c.VerifyConnection = tlsverify.Against(id.roots, name, "xds: the management server")
	}
	return c
}

// xdsStart is what startXDS needs.
type xdsStart struct {
	x     *xdsSettings
	id    *identity // TLS files, nil for none
	load  config.Options
	m     *xds.Metrics
	log   *slog.Logger
	apply func(*config.Snapshot, error)
}

// startXDS receives the rules from --xds-server in the background (on wg)
// until ctx is done, handing each set to apply, and returns once the first
// valid set is in force — at once with --xds-start-without-rules.
func startXDS(ctx context.Context, wg *sync.WaitGroup, st xdsStart) error {
	x, log := st.x, st.log
	first := make(chan struct{})
	var once sync.Once
	failed := make(chan error, 1)
	xo := x.opts
	xo.TLS, xo.Load, xo.Metrics, xo.Logger = xdsTLS(x, st.id), st.load, st.m, log
	xo.OnLoad = func(s *config.Snapshot, err error) {
		st.apply(s, err)
		if err == nil {
			once.Do(func() { close(first) })
		}
	}
	wg.Go(func() {
		if err := xds.Run(ctx, xo); err != nil {
			failed <- err
		}
	})
	if x.startWithoutRules {
		answer := "UNAVAILABLE (Envoy's failure_mode_deny decides)"
		if x.beforeRules == "ok" {
			answer = "OK, with no limit"
		}
		log.Warn("serving before --xds-server sent rules: every request is answered "+answer+" until it does", "server", xo.Server)
		return nil
	}
	log.Info("waiting for the first rules from --xds-server", "server", xo.Server, "node", xo.NodeID)
	select {
	case <-first:
		return nil
	case err := <-failed:
		return err
	case <-ctx.Done():
		return errors.New("stopped before --xds-server sent valid rules")
	}
}
