package redisstore

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net/url"
	"os"
	"time"

	"github.com/redis/go-redis/v9"
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
	mode := opts.Mode
	if mode == "" {
		mode = ModeSingle
		if u, err := url.Parse(opts.URL); err == nil && u.Query().Has("master_name") {
			mode = ModeSentinel
		}
	}
	tlsConf, err := tlsConfig(opts)
	if err != nil {
		return nil, nil, "", err
	}
	dial := min(time.Second, max(timeout, 100*time.Millisecond))
	switch mode {
	case ModeSingle:
		o, err := redis.ParseURL(opts.URL)
		if err != nil {
			return nil, nil, "", urlError("parse --redis-url", opts.URL, err)
		}
		o.MaxRetries, o.ContextTimeoutEnabled, o.DisableIdentity = -1, true, true
		o.ReadTimeout, o.WriteTimeout, o.PoolTimeout = timeout, timeout, timeout
		o.DialTimeout, o.DialerRetries, o.Protocol = dial, 1, resp
		if opts.Password != "" {
			o.Password = opts.Password
		}
		if o.TLSConfig, err = mergeTLS(o.TLSConfig, tlsConf); err != nil {
			return nil, nil, "", err
		}
		return redis.NewClient(o), nil, mode, nil
	case ModeSentinel:
		o, err := redis.ParseFailoverURL(opts.URL)
		if err != nil {
			return nil, nil, "", urlError("parse --redis-url for sentinel", opts.URL, err)
		}
		o.MaxRetries, o.ContextTimeoutEnabled, o.DisableIdentity = -1, true, true
		o.ReadTimeout, o.WriteTimeout, o.PoolTimeout = timeout, timeout, timeout
		o.DialTimeout, o.DialerRetries, o.Protocol = dial, 1, resp
		if opts.Password != "" {
			o.Password = opts.Password
		}
		if o.TLSConfig, err = mergeTLS(o.TLSConfig, tlsConf); err != nil {
			return nil, nil, "", err
		}
		return redis.NewFailoverClient(o), nil, mode, nil
	case ModeCluster:
		o, err := redis.ParseClusterURL(opts.URL)
		if err != nil {
			return nil, nil, "", urlError("parse --redis-url for cluster", opts.URL, err)
		}
		// MOVED and ASK are followed (MaxRedirects); go-redis also retries
		// connection errors within that budget, bounded by the context,
		// without backoff sleeps.
		o.MaxRedirects, o.MinRetryBackoff, o.MaxRetryBackoff = 3, -1, -1
		o.ContextTimeoutEnabled, o.DisableIdentity = true, true
		o.ReadTimeout, o.WriteTimeout, o.PoolTimeout = timeout, timeout, timeout
		o.DialTimeout, o.DialerRetries, o.Protocol = dial, 1, resp
		if opts.Password != "" {
			o.Password = opts.Password
		}
		if o.TLSConfig, err = mergeTLS(o.TLSConfig, tlsConf); err != nil {
			return nil, nil, "", err
		}
		c := redis.NewClusterClient(o)
		return c, c, mode, nil
	}
	return nil, nil, "", fmt.Errorf("redisstore: --redis-mode %q: want single, sentinel or cluster", mode)
}

// tlsConfig reads the CA and client certificate files, or returns nil
// when none is set.
func tlsConfig(opts Options) (*tls.Config, error) {
	if opts.TLSCA == "" && opts.TLSCert == "" && opts.TLSKey == "" {
		return nil, nil
	}
	conf := &tls.Config{MinVersion: tls.VersionTLS12}
	if opts.TLSCA != "" {
		pem, err := os.ReadFile(opts.TLSCA)
		if err != nil {
			return nil, fmt.Errorf("redisstore: --redis-tls-ca: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("redisstore: --redis-tls-ca %s: no PEM certificate in it", opts.TLSCA)
		}
		conf.RootCAs = pool
	}
	if (opts.TLSCert == "") != (opts.TLSKey == "") {
		return nil, errors.New("redisstore: --redis-tls-cert and --redis-tls-key go together")
	}
	if opts.TLSCert != "" {
		cert, err := tls.LoadX509KeyPair(opts.TLSCert, opts.TLSKey)
		if err != nil {
			return nil, fmt.Errorf("redisstore: --redis-tls-cert/--redis-tls-key: %w", err)
		}
		conf.Certificates = []tls.Certificate{cert}
	}
	return conf, nil
}

// mergeTLS adds the files' settings to the URL's TLS config (rediss://
// sets one, with the server name).
func mergeTLS(fromURL, files *tls.Config) (*tls.Config, error) {
	if files == nil {
		return fromURL, nil
	}
	if fromURL == nil {
		return nil, errors.New("redisstore: --redis-tls-* need a rediss:// URL")
	}
	fromURL.RootCAs, fromURL.Certificates = files.RootCAs, files.Certificates
	if fromURL.MinVersion < tls.VersionTLS12 {
		fromURL.MinVersion = tls.VersionTLS12
	}
	return fromURL, nil
}
