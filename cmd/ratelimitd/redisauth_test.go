package main

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/ratelimitd/ratelimitd/internal/redisstore/redistest"
)

// TestIncumbentRedisAuth: under the incumbent's environment, the main
// Redis (REDIS_*) and the per-second one (REDIS_PERSECOND_*) each decide
// their counters, for every topology (single, Sentinel, Cluster) and
// every way a Redis makes its clients prove themselves (none, a password,
// an ACL user and its password, TLS with client certificates): a third
// call over a limit of two is refused, which only a Redis that answers
// can do (the failure policy answers OK). The per-second Redis behind
// Sentinel with a password once answered NOAUTH to every call.
func TestIncumbentRedisAuth(t *testing.T) {
	certs := redistest.NewCerts(t)
	auths := []redistest.Auth{{}, {Password: "s3cret"}, {User: "limiter", Password: "s3cret"}, {Certs: certs}}
	type topo struct {
		typ string
		url func(t *testing.T, a redistest.Auth) string
	}
	addrs := func(servers []*redistest.Server) []string {
		var out []string
		for _, s := range servers {
			out = append(out, s.Addr())
		}
		return out
	}
	topos := []topo{
		{"single", func(t *testing.T, a redistest.Auth) string { return redistest.StartWith(t, a).Addr() }},
		{"sentinel", func(t *testing.T, a redistest.Auth) string {
			st := redistest.StartSentinelWith(t, a)
			return st.Name + "," + strings.Join(addrs(st.Sentinels), ",")
		}},
		{"cluster", func(t *testing.T, a redistest.Auth) string {
			return strings.Join(addrs(redistest.StartClusterWith(t, 3, a)), ",")
		}},
	}
	rules := incumbentRules(t, "domain: auth\ndescriptors:\n  - key: m\n    rate_limit: {unit: minute, requests_per_unit: 2}\n  - key: s\n    rate_limit: {unit: second, requests_per_unit: 2}\n")
	for _, tp := range topos {
		for _, a := range auths {
			t.Run(tp.typ+"/"+a.String(), func(t *testing.T) {
				vars := map[string]string{"RUNTIME_ROOT": rules, "RUNTIME_SUBDIRECTORY": "ratelimit",
					"REDIS_TYPE": tp.typ, "REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": tp.url(t, a),
					"REDIS_PERSECOND": "true", "REDIS_PERSECOND_TYPE": tp.typ, "REDIS_PERSECOND_SOCKET_TYPE": "tcp",
					"REDIS_PERSECOND_URL": tp.url(t, a)}
				switch {
				case a.Certs != nil:
					vars["REDIS_TLS"], vars["REDIS_PERSECOND_TLS"] = "true", "true"
					vars["REDIS_TLS_CACERT"], vars["REDIS_TLS_CLIENT_CERT"], vars["REDIS_TLS_CLIENT_KEY"] = a.Certs.CA, a.Certs.ClientCert, a.Certs.ClientKey
				case a.User != "":
					vars["REDIS_AUTH"], vars["REDIS_PERSECOND_AUTH"] = a.User+":"+a.Password, a.User+":"+a.Password
				case a.Password != "":
					vars["REDIS_AUTH"], vars["REDIS_PERSECOND_AUTH"] = a.Password, a.Password
				}
				p := runAsIncumbent(t, vars)
				client := rlsv3.NewRateLimitServiceClient(dial(t, p.grpcAddr))
				for _, key := range []string{"m", "s"} {
					var seen []string
					eventuallyWithin(t, 30*time.Second, "a third call over a limit of 2 on "+key+" refused", func() error {
						var codes []rlsv3.RateLimitResponse_Code
						value := fmt.Sprint(time.Now().UnixNano()) // a fresh counter each burst
						for range 3 {
							r, err := client.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "auth",
								Descriptors: []*rlcommon.RateLimitDescriptor{desc(key, value)}})
							if err != nil {
								return err
							}
							codes = append(codes, r.GetOverallCode())
						}
						seen = append(seen, fmt.Sprint(codes))
						if codes[2] != rlsv3.RateLimitResponse_OVER_LIMIT {
							return fmt.Errorf("answers %v (a Redis not reached?)\n%s", seen, p.log.String())
						}
						return nil
					})
				}
			})
		}
	}
}
