package main

import (
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/keepalive"
)

// grpcServerOptions turns the settings into server options: TLS (and mTLS
// with --grpc-client-ca) from the files in force, reloaded as they change
// (see identity), the message size bound, the streams one
// connection may have open at once, and keepalive rules that keep idle
// Envoy connections alive but refuse pings more often than every 10 s.
func grpcServerOptions(s *settings, id *identity) []grpc.ServerOption {
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
	if id == nil {
		return opts
	}
	return append(opts, grpc.Creds(credentials.NewTLS(id.serverConfig())))
}
