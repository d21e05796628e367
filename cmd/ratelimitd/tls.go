package main

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"sync/atomic"
)

// loadPool reads a PEM file of CA certificates. A file that holds none is
// an error: an empty pool would refuse every peer, or, where the pool is
// optional, quietly trust the system's roots instead.
func loadPool(flagName, file string) (*x509.CertPool, error) {
	pem, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", flagName, err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("%s %s: no PEM certificate in it", flagName, file)
	}
	return pool, nil
}

// loadPair reads a certificate and its private key.
func loadPair(certFlag, certFile, keyFile string) (*tls.Certificate, error) {
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", certFlag, err)
	}
	return &cert, nil
}

// identity is one side's TLS files, a certificate and key and/or a CA,
// loaded whole and swapped in atomically: connections made after a
// reload use the new ones, those already open keep theirs. A reload that
// fails keeps what is in force.
type identity struct {
	name                      string // "grpc" or "redis": logs and metrics
	certFlag, caFlag          string
	certFile, keyFile, caFile string
	cert                      atomic.Pointer[tls.Certificate]
	pool                      atomic.Pointer[x509.CertPool]
}

// loadIdentity loads id's files; nil when none is set.
func loadIdentity(id *identity) (*identity, error) {
	if id.certFile == "" && id.caFile == "" {
		return nil, nil
	}
	return id, id.reload()
}

// files returns the files to watch.
func (id *identity) files() []string {
	var out []string
	for _, f := range []string{id.certFile, id.keyFile, id.caFile} {
		if f != "" {
			out = append(out, f)
		}
	}
	return out
}

// reload loads every file, and swaps them in only if all load.
func (id *identity) reload() error {
	var cert *tls.Certificate
	var pool *x509.CertPool
	var errs []error
	if id.certFile != "" {
		c, err := loadPair(id.certFlag, id.certFile, id.keyFile)
		errs = append(errs, err)
		cert = c
	}
	if id.caFile != "" {
		p, err := loadPool(id.caFlag, id.caFile)
		errs = append(errs, err)
		pool = p
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	if cert != nil {
		id.cert.Store(cert)
	}
	if pool != nil {
		id.pool.Store(pool)
	}
	return nil
}

// serverConfig serves the current certificate and, with a CA, requires
// and verifies client certificates against the current CA.
func (id *identity) serverConfig() *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
			c := &tls.Config{
				MinVersion:   tls.VersionTLS12,
				Certificates: []tls.Certificate{*id.cert.Load()},
				// What gRPC's credentials add to the config they are
				// given; a config from here replaces that one.
				NextProtos: []string{"h2"},
			}
			if pool := id.pool.Load(); pool != nil {
				c.ClientCAs, c.ClientAuth = pool, tls.RequireAndVerifyClientCert
			}
			return c, nil
		},
	}
}

// clientCert returns the certificate in force (for a client).
func (id *identity) clientCert() *tls.Certificate { return id.cert.Load() }

// roots returns the CA pool in force.
func (id *identity) roots() *x509.CertPool { return id.pool.Load() }
