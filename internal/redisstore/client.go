package redisstore

import (
	"crypto/tls"
	"errors"
	"fmt"
	"net/url"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratelimitd/ratelimitd/internal/tlsverify"
)

// The deployment modes.
const (
	ModeSingle   = "single"
	ModeSentinel = "sentinel"
	ModeCluster  = "cluster"
)

// resp is the protocol version spoken to Redis: RESP2. The script's
// replies are the same in both; with RESP3 go-redis checks every
// connection for push notifications before each reply (2 % of the
// service's CPU under load), which the store never uses.
const resp = 2

// newClient builds the go-redis client for the mode, from go-redis's own
// URL parsers, with every call bounded and no retries: a retry after a
// timeout doubles the wait and may replay a script that already ran.
func newClient(opts Options, timeout time.Duration) (redis.UniversalClient, *redis.ClusterClient, string, error) {
	mode := urlMode(opts.URL, opts.Mode)
	switch mode {
	case ModeSingle:
		o, err := redis.ParseURL(opts.URL)
		if err != nil {
			return nil, nil, "", urlError("parse the URL", opts.URL, err)
		}
		o.MaxRetries = -1
		if err := bound(common{&o.ReadTimeout, &o.WriteTimeout, &o.PoolTimeout, &o.DialTimeout, &o.DialerRetries, &o.Protocol,
			&o.ContextTimeoutEnabled, &o.DisableIdentity, &o.Password, &o.TLSConfig}, opts, timeout); err != nil {
			return nil, nil, "", err
		}
		return redis.NewClient(o), nil, mode, nil
	case ModeSentinel:
		o, err := redis.ParseFailoverURL(opts.URL)
		if err != nil {
			return nil, nil, "", urlError("parse the URL for sentinel", opts.URL, err)
		}
		o.MaxRetries = -1
		if err := bound(common{&o.ReadTimeout, &o.WriteTimeout, &o.PoolTimeout, &o.DialTimeout, &o.DialerRetries, &o.Protocol,
			&o.ContextTimeoutEnabled, &o.DisableIdentity, &o.Password, &o.TLSConfig}, opts, timeout); err != nil {
			return nil, nil, "", err
		}
		return redis.NewFailoverClient(o), nil, mode, nil
	case ModeCluster:
		o, err := redis.ParseClusterURL(opts.URL)
		if err != nil {
			return nil, nil, "", urlError("parse the URL for cluster", opts.URL, err)
		}
		// MOVED and ASK are followed (MaxRedirects); go-redis also retries
		// connection errors within that budget, bounded by the context,
		// without backoff sleeps.
		o.MaxRedirects, o.MinRetryBackoff, o.MaxRetryBackoff = 3, -1, -1
		if err := bound(common{&o.ReadTimeout, &o.WriteTimeout, &o.PoolTimeout, &o.DialTimeout, &o.DialerRetries, &o.Protocol,
			&o.ContextTimeoutEnabled, &o.DisableIdentity, &o.Password, &o.TLSConfig}, opts, timeout); err != nil {
			return nil, nil, "", err
		}
		c := redis.NewClusterClient(o)
		return c, c, mode, nil
	}
	return nil, nil, "", fmt.Errorf("redisstore: mode %q: want single, sentinel or cluster", mode)
}

// urlMode is the mode a store on raw runs in: mode, else Sentinel when
// the URL names a master, else single.
func urlMode(raw, mode string) string {
	if mode != "" {
		return mode
	}
	if u, err := url.Parse(raw); err == nil && u.Query().Has("master_name") {
		return ModeSentinel
	}
	return ModeSingle
}

// parseURL checks raw as newClient will parse it in mode, connecting to
// nothing: the parser's error, unredacted.
func parseURL(raw, mode string) error {
	var err error
	switch urlMode(raw, mode) {
	case ModeSingle:
		_, err = redis.ParseURL(raw)
	case ModeSentinel:
		_, err = redis.ParseFailoverURL(raw)
	case ModeCluster:
		_, err = redis.ParseClusterURL(raw)
	}
	return err
}

// common points at the settings every mode's go-redis options share.
type common struct {
	read, write, pool, dial     *time.Duration
	dialerRetries, protocol     *int
	ctxTimeout, disableIdentity *bool
	password                    *string
	tls                         **tls.Config
}

// bound gives a client of any mode the same settings: every call bounded
// by timeout (the pool wait too; a dial by at most a second), the context's
// deadline followed, one dial attempt, RESP2, no CLIENT SETINFO, and the
// options' password and TLS files over the URL's.
func bound(c common, opts Options, timeout time.Duration) error {
	*c.read, *c.write, *c.pool = timeout, timeout, timeout
	*c.dial = min(time.Second, max(timeout, 100*time.Millisecond))
	*c.dialerRetries, *c.protocol = 1, resp
	*c.ctxTimeout, *c.disableIdentity = true, true
	if opts.Password != "" {
		*c.password = opts.Password
	}
	var err error
	*c.tls, err = mergeTLS(*c.tls, opts)
	return err
}

// tlsSettings reports whether opts hold TLS settings of their own.
func tlsSettings(opts Options) bool { return opts.ClientCert != nil || opts.RootCAs != nil }

// mergeTLS adds the options' client certificate and CAs to the URL's TLS
// config (rediss:// sets one, with the server name). The certificate and
// CAs are asked for at each handshake; the server is then verified here,
// against the CAs in force and the URL's server name, since crypto/tls
// cannot change RootCAs under a live config.
func mergeTLS(fromURL *tls.Config, opts Options) (*tls.Config, error) {
	if !tlsSettings(opts) {
		return fromURL, nil
	}
	if fromURL == nil {
		return nil, errors.New("redisstore: TLS certificates need a rediss:// URL")
	}
	c := fromURL.Clone()
	if c.MinVersion < tls.VersionTLS12 {
		c.MinVersion = tls.VersionTLS12
	}
	if opts.ClientCert != nil {
		c.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return opts.ClientCert(), nil }
	}
	if opts.RootCAs != nil {
		name := c.ServerName
		c.InsecureSkipVerify = true // replaced by VerifyConnection, which runs on every handshake
		c.VerifyConnection = tlsverify.Against(opts.RootCAs, name, "redisstore: Redis")
	}
	return c, nil
}
