package incumbentenv

import (
	"slices"
	"strings"
	"testing"
)

func env(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

func flags(r Result) []string {
	var out []string
	for _, a := range r.Flags {
		out = append(out, a.Flag+"="+a.Value)
	}
	return out
}

// TestEnvoyproxy: the incumbent's variables map to flag assignments, as a
// pure function of the environment.
func TestEnvoyproxy(t *testing.T) {
	for _, tt := range []struct {
		name string
		env  map[string]string
		want []string
	}{
		{"nothing set: statsd on, as the incumbent's default", nil, []string{"statsd-addr=localhost:8125"}},
		{"stats off", map[string]string{"DISABLE_STATS": "true", "USE_PROMETHEUS": "garbage"}, nil},
		{"prometheus alone", map[string]string{"USE_PROMETHEUS": "true", "PROMETHEUS_ADDR": ":9102"}, []string{"compat-metrics-addr=:9102"}},
		{"sentinel", map[string]string{"DISABLE_STATS": "true", "REDIS_TYPE": "SENTINEL", "REDIS_URL": "mymaster,s1:26379,s2:26379", "REDIS_SOCKET_TYPE": "tcp"},
			[]string{"redis-url=redis://s1:26379?master_name=mymaster&addr=s2:26379", "redis-mode=sentinel"}},
		{"cluster over TLS with a user", map[string]string{"DISABLE_STATS": "true", "REDIS_TYPE": "cluster", "REDIS_URL": "a:1,b:2", "REDIS_TLS": "true", "REDIS_AUTH": "u:p"},
			[]string{"redis-url=rediss://u@a:1?addr=b:2", "redis-mode=cluster"}},
		{"unix socket by default", map[string]string{"DISABLE_STATS": "true", "REDIS_URL": "/var/run/redis.sock"}, []string{"redis-url=unix:///var/run/redis.sock", "redis-mode=single"}},
		{"tracing over OTLP/HTTP by default", map[string]string{"DISABLE_STATS": "true", "TRACING_ENABLED": "true"},
			[]string{"tracing-protocol=http", "tracing-endpoint=localhost:4318"}},
		{"rules files", map[string]string{"DISABLE_STATS": "true", "RUNTIME_ROOT": "/data", "RUNTIME_SUBDIRECTORY": "ratelimit"}, []string{"config=/data/ratelimit/config"}},
		{"rules over xDS", map[string]string{"DISABLE_STATS": "true", "CONFIG_TYPE": "GRPC_XDS_SOTW", "CONFIG_GRPC_XDS_NODE_ID": "n1"},
			[]string{"xds-server=localhost:18000", "xds-node-id=n1"}},
		{"listen addresses", map[string]string{"DISABLE_STATS": "true", "PORT": "8080", "GRPC_HOST": "0.0.0.0", "GRPC_PORT": "8081"},
			[]string{"http-addr=:8080", "grpc-addr=0.0.0.0:8081"}},
		{"REDIS_TIMEOUT honoured", map[string]string{"DISABLE_STATS": "true", "REDIS_TIMEOUT": "10s"}, []string{"redis-timeout=10s"}},
		{"gRPC over TLS, client certificates verified", map[string]string{"DISABLE_STATS": "true", "GRPC_SERVER_USE_TLS": "true",
			"GRPC_SERVER_TLS_CERT": "/tls/cert.pem", "GRPC_SERVER_TLS_KEY": "/tls/key.pem", "GRPC_CLIENT_TLS_CACERT": "/tls/ca.pem"},
			[]string{"grpc-tls-cert=/tls/cert.pem", "grpc-tls-key=/tls/key.pem", "grpc-client-ca=/tls/ca.pem"}},
	} {
		res, err := Envoyproxy(env(tt.env))
		if err != nil {
			t.Errorf("%s: %v", tt.name, err)
			continue
		}
		if got := flags(res); !slices.Equal(got, tt.want) {
			t.Errorf("%s: %v, want %v", tt.name, got, tt.want)
		}
	}
	res, err := Envoyproxy(env(map[string]string{"REDIS_AUTH": "user:secret", "REDIS_POOL_SIZE": "10"}))
	if err != nil || res.RedisPassword != "secret" || len(res.Ignored) != 1 || !strings.HasPrefix(res.Ignored[0], "REDIS_POOL_SIZE: ") {
		t.Errorf("password %q, ignored %v, err %v", res.RedisPassword, res.Ignored, err)
	}
	for name, e := range map[string]map[string]string{
		"BACKEND_TYPE":            {"BACKEND_TYPE": "memcache"},
		"REDIS_TYPE":              {"REDIS_TYPE": "ring", "REDIS_URL": "h:1"},
		"GRPC_PORT":               {"GRPC_HOST": "h"},
		"USE_STATSD":              {"USE_STATSD": "maybe"},
		"REDIS_PERSECOND_URL":     {"REDIS_PERSECOND": "true", "REDIS_URL": "h:1", "REDIS_SOCKET_TYPE": "tcp"},
		"DOG_STATSD_MOGRIFIER_A_": {"USE_DOG_STATSD_MOGRIFIERS": "A"},
		// A host:port with the socket type unset (the incumbent's
		// default: unix) says to set it.
		"REDIS_SOCKET_TYPE=tcp": {"REDIS_URL": "127.0.0.1:6379"},
		"PORT=\"notaport\"":     {"PORT": "notaport"},
	} {
		if _, err := Envoyproxy(env(e)); err == nil || !strings.Contains(err.Error(), name) {
			t.Errorf("%v: %v, want an error naming %s", e, err, name)
		}
	}
}
