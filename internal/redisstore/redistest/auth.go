package redistest

import (
	"fmt"
	"strings"
	"testing"
)

// Auth is how a test's Redis servers make their clients prove themselves:
// nothing (the zero value); a password (requirepass); an ACL user and its
// password, the default user then holding adminPassword, so that a client
// sending the user's password alone is refused; or TLS with client
// certificates from Certs. Replicas, sentinels and cluster buses
// authenticate the same way.
type Auth struct {
	User, Password string
	Certs          *Certs
}

// adminPassword is the default user's password under an ACL user: what
// redistest's own clients send.
const adminPassword = "redistest-admin"

// String names the auth for a subtest.
func (a Auth) String() string {
	switch {
	case a.Certs != nil:
		return "tls"
	case a.User != "":
		return "user:password"
	case a.Password != "":
		return "password"
	}
	return "no auth"
}

// clientPassword is what redistest's own clients send as the default
// user's password.
func (a Auth) clientPassword() string {
	if a.User != "" {
		return adminPassword
	}
	return a.Password
}

// serverArgs are a data node's arguments, a replica's included.
func (a Auth) serverArgs() []string {
	var args []string
	switch {
	case a.User != "":
		args = []string{"--requirepass", adminPassword, "--user", a.User, "on", ">" + a.Password, "~*", "&*", "+@all",
			"--masteruser", a.User, "--masterauth", a.Password}
	case a.Password != "":
		args = []string{"--requirepass", a.Password, "--masterauth", a.Password}
	}
	return append(args, a.tlsArgs()...)
}

// tlsArgs make a server (data node or sentinel) speak TLS only, to its
// clients and to its peers, with the test certificates.
func (a Auth) tlsArgs() []string {
	if a.Certs == nil {
		return nil
	}
	c := a.Certs
	return []string{"--tls-cert-file", c.ServerCert, "--tls-key-file", c.ServerKey, "--tls-ca-cert-file", c.CA,
		"--tls-client-cert-file", c.ClientCert, "--tls-client-key-file", c.ClientKey, "--tls-auth-clients", "yes",
		"--tls-replication", "yes", "--tls-cluster", "yes"}
}

// sentinelLines are a sentinel's configuration lines to authenticate to
// the master called name and its replicas.
func (a Auth) sentinelLines(name string) string {
	var b strings.Builder
	if a.User != "" {
		fmt.Fprintf(&b, "sentinel auth-user %s %s\n", name, a.User)
	}
	if a.Password != "" {
		fmt.Fprintf(&b, "sentinel auth-pass %s %s\n", name, a.Password)
	}
	return b.String()
}

// StartWith runs a fresh redis-server, as Start, requiring auth.
func StartWith(t testing.TB, auth Auth, args ...string) *Server {
	t.Helper()
	s := newServer(t, auth, args...)
	s.start()
	t.Cleanup(s.Kill)
	return s
}

// newServer is a server to start, requiring auth.
func newServer(t testing.TB, auth Auth, args ...string) *Server {
	t.Helper()
	s := &Server{t: t, bin: Binary(t), dir: t.TempDir(), args: append(auth.serverArgs(), args...), Port: freePort(t),
		password: auth.clientPassword()}
	if auth.Certs != nil {
		s.tls = auth.Certs.ClientTLS()
	}
	return s
}
