// Package tlsverify checks a server's certificate against CAs that can
// change while the process runs: crypto/tls cannot swap RootCAs under a
// live config, so a client config skips its own check and runs this one
// on every handshake instead.
package tlsverify

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
)

// Against returns a tls.Config.VerifyConnection that verifies the peer's
// chain against the pool roots returns at that handshake, and its name
// against name. Use it with InsecureSkipVerify, which it replaces.
func Against(roots func() *x509.CertPool, name, peer string) func(tls.ConnectionState) error {
	return func(cs tls.ConnectionState) error {
		if len(cs.PeerCertificates) == 0 {
			return errors.New(peer + " sent no certificate")
		}
		v := x509.VerifyOptions{Roots: roots(), DNSName: name, Intermediates: x509.NewCertPool()}
		for _, ic := range cs.PeerCertificates[1:] {
			v.Intermediates.AddCert(ic)
		}
		_, err := cs.PeerCertificates[0].Verify(v)
		return err
	}
}
