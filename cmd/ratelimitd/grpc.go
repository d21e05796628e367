package main

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/keepalive"
)

// grpcServerOptions turns the settings into server options: TLS (and mTLS
// with --grpc-client-ca), the message size bound, the streams one
// connection may have open at once, and keepalive rules that keep idle
// Envoy connections alive but refuse pings more often than every 10 s.
func grpcServerOptions(s *settings) ([]grpc.ServerOption, error) {
	opts := []grpc.ServerOption{
		grpc.MaxRecvMsgSize(int(s.grpcMaxMessage)),
		// Without a bound, a client that opens streams and never reads
		// the answers held ~3.7 KB a stream (100,000 streams: +364 MB,
		// kept after it left) and starved every other caller
		// (TestSlowReaderBounded). Streams beyond it are refused
		// (REFUSED_STREAM), which clients retry; Envoy keeps far fewer
		// open per connection and opens more connections as needed.
		grpc.MaxConcurrentStreams(s.grpcMaxStreams),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 10 * time.Second, PermitWithoutStream: true}),
		grpc.KeepaliveParams(keepalive.ServerParameters{
			Time: 30 * time.Second, Timeout: 10 * time.Second,
			// Rebalances long-lived connections across instances.
			MaxConnectionAge: 24 * time.Hour, MaxConnectionAgeGrace: time.Hour,
		}),
	}
	if s.grpcTLSCert == "" {
		return opts, nil
	}
	cert, err := tls.LoadX509KeyPair(s.grpcTLSCert, s.grpcTLSKey)
	if err != nil {
		return nil, fmt.Errorf("--grpc-tls-cert/--grpc-tls-key: %w", err)
	}
	conf := &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	if s.grpcClientCA != "" {
		pem, err := os.ReadFile(s.grpcClientCA)
		if err != nil {
			return nil, fmt.Errorf("--grpc-client-ca: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("--grpc-client-ca %s: no PEM certificate in it", s.grpcClientCA)
		}
		conf.ClientCAs, conf.ClientAuth = pool, tls.RequireAndVerifyClientCert
	}
	return append(opts, grpc.Creds(credentials.NewTLS(conf))), nil
}
