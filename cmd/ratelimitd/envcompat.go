package main

import (
	"fmt"
	"net"
	"net/url"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/ratelimitd/ratelimitd/internal/compatstats"
)

// envSetting is one of envoyproxy/ratelimit's environment variables, as
// --env-compat=envoyproxy reads it.
type envSetting struct {
	name string
	// flag is the ratelimitd flag it sets ("" when it is read with
	// others, or ignored); ignore says why ratelimitd does without it;
	// refuse says why it cannot honour a value other than ok.
	flag   string
	ignore string
	refuse string
	ok     []string // values that need no flag (refuse applies to others)
}

// envoyproxySettings are the incumbent's variables and what becomes of
// each. Those read together (Redis address, runtime directory, listen
// addresses) are handled in envoyproxyEnv; docs/migrating.md lists them all.
var envoyproxySettings = []envSetting{
	{name: "LOCAL_CACHE_SIZE_IN_BYTES", flag: "local-cache-size"},
	{name: "CACHE_KEY_PREFIX", flag: "key-prefix"},
	{name: "SHADOW_MODE", flag: "shadow-mode"},
	{name: "MERGE_DOMAIN_CONFIG", flag: "merge-domains"},
	{name: "NEAR_LIMIT_RATIO", flag: "near-limit-ratio"},
	{name: "LOG_FORMAT", flag: "log-format"},
	{name: "GRPC_SERVER_TLS_CERT", flag: "grpc-tls-cert"},
	{name: "GRPC_SERVER_TLS_KEY", flag: "grpc-tls-key"},
	{name: "GRPC_CLIENT_TLS_CACERT", flag: "grpc-client-ca"},
	{name: "REDIS_TLS_CACERT", flag: "redis-tls-ca"},
	{name: "REDIS_TLS_CLIENT_CERT", flag: "redis-tls-cert"},
	{name: "REDIS_TLS_CLIENT_KEY", flag: "redis-tls-key"},
	{name: "BACKEND_TYPE", ok: []string{"redis"}, refuse: "ratelimitd keeps counters in Redis (or in process); there is no memcache backend"},
	{name: "CONFIG_TYPE", ok: []string{"FILE", "GRPC_XDS_SOTW"}, refuse: "want FILE or GRPC_XDS_SOTW"},
	{name: "REDIS_SENTINEL_AUTH", refuse: "sentinels that require a password are not supported"},
	{name: "REDIS_TLS_SKIP_HOSTNAME_VERIFICATION", ok: []string{"false"}, refuse: "ratelimitd always verifies Redis's certificate name"},
	{name: "GRPC_CLIENT_TLS_SAN", refuse: "client certificates are verified against --grpc-client-ca, not a SAN"},
	{name: "GRPC_UDS", refuse: "gRPC on a unix socket is not supported"},
	{name: "QUOTA_MODE", ok: []string{"false"}, refuse: "global quota mode is not supported; set quota_mode on the rules"},
	{name: "LIMIT_LIMIT_HEADER", flag: "response-header-limit"},
	{name: "LIMIT_REMAINING_HEADER", flag: "response-header-remaining"},
	{name: "LIMIT_RESET_HEADER", flag: "response-header-reset"},
	{name: "STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT", ignore: "a rejected request never consumes, always"},
	{name: "EXPIRATION_JITTER_MAX_SECONDS", ignore: "keys expire at their window's end, set in the same script"},
	{name: "RESPONSE_DYNAMIC_METADATA", ignore: "rule metadata is not returned; --decision-metadata explains decisions"},
	{name: "RUNTIME_WATCH_ROOT", ignore: "the rules directory is watched for every kind of change"},
	{name: "RUNTIME_IGNOREDOTFILES", ignore: "dot files are always skipped"},
	{name: "EXTRA_TAGS", flag: "statsd-tags"},
	{name: "STATS_FLUSH_INTERVAL", flag: "stats-flush-interval"},
	{name: "PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS", ok: []string{"false"}, refuse: "the response time histogram is in seconds (the mapping's scale: 0.001), as the incumbent's default"},
	{name: "GRPC_SERVER_TLS_CA_CERT", ignore: "not a variable envoyproxy/ratelimit reads (it verifies clients with GRPC_CLIENT_TLS_CACERT), so not one ratelimitd reads either"},
	{name: "REDIS_POOL_SIZE", ignore: "one batching connection per Redis serves every request (--redis-dispatchers)"},
	{name: "REDIS_PIPELINE_WINDOW", ignore: "requests are batched with no added wait"},
	{name: "REDIS_PIPELINE_LIMIT", ignore: "requests are batched with no added wait"},
	{name: "REDIS_TIMEOUT", ignore: "every Redis call is bounded by --redis-timeout (50ms)"},
	{name: "REDIS_POOL_ON_EMPTY_BEHAVIOR", ignore: "calls are bounded by --redis-timeout"},
	{name: "REDIS_HEALTH_CHECK_ACTIVE_CONNECTION", ignore: "health stays SERVING and Redis failures answer by failure_mode"},
	{name: "HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED", ignore: "the service serves only once it has valid rules, unless --xds-start-without-rules"},
	{name: "GRPC_MAX_CONNECTION_AGE", ignore: "fixed at 24h"},
	{name: "GRPC_MAX_CONNECTION_AGE_GRACE", ignore: "fixed at 1h"},
	{name: "TRACING_SERVICE_NAME", flag: "tracing-service-name"},
	{name: "TRACING_SERVICE_NAMESPACE", flag: "tracing-service-namespace"},
	{name: "TRACING_SERVICE_INSTANCE_ID", flag: "tracing-service-instance-id"},
	{name: "TRACING_SAMPLING_RATE", flag: "tracing-sampling-rate"},
	{name: "TRACING_EXPORTER_PROTOCOL", flag: "tracing-protocol"},
}

// envoyproxyXDS are the incumbent's xDS variables, read when
// CONFIG_TYPE=GRPC_XDS_SOTW, with the flags they set.
var envoyproxyXDS = []envSetting{
	{name: "CONFIG_GRPC_XDS_NODE_ID", flag: "xds-node-id"},
	{name: "CONFIG_GRPC_XDS_NODE_METADATA", flag: "xds-node-metadata"},
	{name: "CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS", flag: "xds-headers"},
	{name: "CONFIG_GRPC_XDS_SERVER_USE_TLS", flag: "xds-tls"},
	{name: "CONFIG_GRPC_XDS_CLIENT_TLS_CERT", flag: "xds-tls-cert"},
	{name: "CONFIG_GRPC_XDS_CLIENT_TLS_KEY", flag: "xds-tls-key"},
	{name: "CONFIG_GRPC_XDS_SERVER_TLS_CACERT", flag: "xds-tls-ca"},
	{name: "CONFIG_GRPC_XDS_SERVER_TLS_SAN", flag: "xds-tls-server-name"},
	{name: "XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES", flag: "xds-max-message-size"},
	{name: "XDS_CLIENT_BACKOFF_INITIAL_INTERVAL", flag: "xds-backoff-initial"},
	{name: "XDS_CLIENT_BACKOFF_MAX_INTERVAL", flag: "xds-backoff-max"},
	{name: "FORCE_START_WITHOUT_INITIAL_CONFIG", flag: "xds-start-without-rules"},
	{name: "XDS_CLIENT_BACKOFF_RANDOM_FACTOR", ignore: "the wait is always jittered within its second half"},
	{name: "XDS_CLIENT_BACKOFF_JITTER", ignore: "the wait is always jittered within its second half"},
	{name: "CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL", ignore: "reconnects follow --xds-backoff-initial and --xds-backoff-max"},
}

// envoyproxyEnv reads envoyproxy/ratelimit's environment: the flag values
// it stands for, a Redis password (REDIS_AUTH), the variables set but
// ignored (with why), or an error naming a variable whose meaning
// ratelimitd cannot honour.
func envoyproxyEnv(getenv func(string) string) (flags [][2]string, password string, ignored []string, err error) {
	set := func(flag, v string) { flags = append(flags, [2]string{flag, v}) }
	// read takes a table's variables: the flags they set, those
	// ignored, or an error for a value that cannot be honoured.
	read := func(table []envSetting) error {
		for _, e := range table {
			v := getenv(e.name)
			switch {
			case v == "":
			case e.flag != "":
				set(e.flag, v)
			case e.refuse != "" && !slices.ContainsFunc(e.ok, func(ok string) bool { return strings.EqualFold(ok, v) }):
				return fmt.Errorf("--env-compat=envoyproxy: %s=%q: %s", e.name, v, e.refuse)
			case e.ignore != "":
				ignored = append(ignored, e.name+": "+e.ignore)
			}
		}
		return nil
	}
	if err := read(envoyproxySettings); err != nil {
		return nil, "", nil, err
	}
	if err := envoyproxyStats(getenv, set); err != nil {
		return nil, "", nil, err
	}
	// TRACING_ENABLED turns tracing on, towards the collector the
	// standard OTEL_EXPORTER_OTLP_ENDPOINT names (default: OTLP's port of
	// the protocol on this host, as the SDK's), over OTLP/HTTP unless
	// TRACING_EXPORTER_PROTOCOL says grpc: the incumbent's settings
	// default it to http.
	if b, _ := strconv.ParseBool(getenv("TRACING_ENABLED")); b {
		grpcProto := strings.EqualFold(getenv("TRACING_EXPORTER_PROTOCOL"), "grpc")
		if getenv("TRACING_EXPORTER_PROTOCOL") == "" {
			set("tracing-protocol", "http")
		}
		endpoint := getenv("OTEL_EXPORTER_OTLP_ENDPOINT")
		switch {
		case endpoint != "":
		case grpcProto:
			endpoint = "localhost:4317"
		default:
			endpoint = "localhost:4318"
		}
		set("tracing-endpoint", endpoint)
	}
	xdsRules := strings.EqualFold(getenv("CONFIG_TYPE"), "GRPC_XDS_SOTW")
	if getenv("FORCE_START_WITHOUT_INITIAL_CONFIG") != "" && !xdsRules {
		ignored = append(ignored, "FORCE_START_WITHOUT_INITIAL_CONFIG: rules files are loaded before serving")
	}
	if v := getenv("LOG_LEVEL"); v != "" {
		set("log-level", strings.ToLower(v))
	}
	if b, _ := strconv.ParseBool(getenv("LIMIT_RESPONSE_HEADERS_ENABLED")); b {
		set("response-headers", "legacy")
	}
	if b, _ := strconv.ParseBool(getenv("GRPC_SERVER_USE_TLS")); !b && getenv("GRPC_SERVER_TLS_CERT") != "" {
		return nil, "", nil, fmt.Errorf("--env-compat=envoyproxy: GRPC_SERVER_TLS_CERT is set but GRPC_SERVER_USE_TLS is not true")
	}
	// Listen addresses: HOST:PORT and GRPC_HOST:GRPC_PORT.
	for _, l := range []struct{ host, port, flag string }{{"HOST", "PORT", "http-addr"}, {"GRPC_HOST", "GRPC_PORT", "grpc-addr"}, {"DEBUG_HOST", "DEBUG_PORT", "debug-addr"}} {
		h, p := getenv(l.host), getenv(l.port)
		if p == "" && h == "" {
			continue
		}
		if p == "" {
			return nil, "", nil, fmt.Errorf("--env-compat=envoyproxy: %s is set without %s", l.host, l.port)
		}
		set(l.flag, net.JoinHostPort(h, p))
	}
	// The rules: over xDS, or in ROOT/SUBDIRECTORY/APPDIRECTORY.
	if xdsRules {
		server := getenv("CONFIG_GRPC_XDS_SERVER_URL")
		if server == "" {
			server = "localhost:18000" // the incumbent's default
		}
		set("xds-server", server)
		if err := read(envoyproxyXDS); err != nil {
			return nil, "", nil, err
		}
		for _, v := range []string{"RUNTIME_ROOT", "RUNTIME_SUBDIRECTORY", "RUNTIME_APPDIRECTORY"} {
			if getenv(v) != "" {
				ignored = append(ignored, v+": CONFIG_TYPE=GRPC_XDS_SOTW: the rules come over xDS")
			}
		}
	} else if sub := getenv("RUNTIME_SUBDIRECTORY"); sub != "" {
		root, app := getenv("RUNTIME_ROOT"), getenv("RUNTIME_APPDIRECTORY")
		if root == "" {
			root = "/srv/runtime_data/current"
		}
		if app == "" {
			app = "config"
		}
		set("config", filepath.Join(root, sub, app))
	}
	u, mode, err := envoyproxyRedisURL(getenv, "REDIS_")
	if err != nil {
		return nil, "", nil, err
	}
	if u != "" {
		set("redis-url", u)
		set("redis-mode", mode)
	}
	if b, _ := strconv.ParseBool(getenv("REDIS_PERSECOND")); b {
		pu, pmode, err := envoyproxyRedisURL(getenv, "REDIS_PERSECOND_")
		switch {
		case err != nil:
			return nil, "", nil, err
		case pu == "":
			return nil, "", nil, fmt.Errorf("--env-compat=envoyproxy: REDIS_PERSECOND=true without REDIS_PERSECOND_URL")
		case pmode != mode:
			return nil, "", nil, fmt.Errorf("--env-compat=envoyproxy: REDIS_PERSECOND_TYPE %s differs from REDIS_TYPE %s: the per-second Redis takes the main one's mode", pmode, mode)
		}
		// Its password goes in its URL: --redis-password-file is the
		// main Redis's.
		if auth := getenv("REDIS_PERSECOND_AUTH"); auth != "" && !strings.Contains(pu, "@") {
			if _, pass, ok := strings.Cut(auth, ":"); ok {
				auth = pass
			}
			pu = strings.Replace(pu, "://", "://"+url.UserPassword("", auth).String()+"@", 1)
		}
		set("redis-persecond-url", pu)
	}
	// REDIS_AUTH is "password" or "user:password"; the user is in the URL.
	password = getenv("REDIS_AUTH")
	if _, pass, ok := strings.Cut(password, ":"); ok {
		password = pass
	}
	return flags, password, ignored, nil
}

// envoyproxyRedisURL builds a Redis URL and mode from the variables
// starting with prefix ("REDIS_" or "REDIS_PERSECOND_"): TYPE, URL,
// SOCKET_TYPE, TLS and AUTH's user.
func envoyproxyRedisURL(getenv func(string) string, prefix string) (string, string, error) {
	raw := getenv(prefix + "URL")
	if raw == "" {
		return "", "", nil
	}
	scheme := "redis"
	if b, _ := strconv.ParseBool(getenv(prefix + "TLS")); b {
		scheme = "rediss"
	}
	user := ""
	if u, _, ok := strings.Cut(getenv(prefix+"AUTH"), ":"); ok && u != "" {
		user = u + "@"
	}
	typ := strings.ToLower(getenv(prefix + "TYPE"))
	switch typ {
	case "", "single":
		if strings.Contains(raw, "://") {
			return raw, "single", nil
		}
		// The incumbent's default socket type is unix.
		if st := strings.ToLower(getenv(prefix + "SOCKET_TYPE")); st == "" || st == "unix" {
			return "unix://" + raw, "single", nil
		}
		return scheme + "://" + user + raw, "single", nil
	case "sentinel":
		parts := strings.Split(raw, ",")
		if len(parts) < 2 {
			return "", "", fmt.Errorf("--env-compat=envoyproxy: %sURL %q: want <master name>,<sentinel host:port>,...", prefix, raw)
		}
		u := scheme + "://" + user + parts[1] + "?master_name=" + parts[0]
		for _, a := range parts[2:] {
			u += "&addr=" + a
		}
		return u, "sentinel", nil
	case "cluster":
		parts := strings.Split(raw, ",")
		u := scheme + "://" + user + parts[0]
		for i, a := range parts[1:] {
			sep := "&"
			if i == 0 {
				sep = "?"
			}
			u += sep + "addr=" + a
		}
		return u, "cluster", nil
	}
	return "", "", fmt.Errorf("--env-compat=envoyproxy: %sTYPE %q: want SINGLE, SENTINEL or CLUSTER", prefix, getenv(prefix+"TYPE"))
}

// envoyproxyStats reads the incumbent's stats sinks: statsd (on unless
// USE_STATSD=false, another sink is chosen, or DISABLE_STATS=true) and
// Prometheus (USE_PROMETHEUS=true). Unlike the incumbent, which refuses
// two sinks, both may be on.
func envoyproxyStats(getenv func(string) string, set func(flag, v string)) error {
	isTrue := func(name string) (bool, error) {
		v := getenv(name)
		if v == "" {
			return false, nil
		}
		b, err := strconv.ParseBool(v)
		if err != nil {
			return false, fmt.Errorf("--env-compat=envoyproxy: %s=%q: want true or false", name, v)
		}
		return b, nil
	}
	off, err := isTrue("DISABLE_STATS")
	if err != nil || off {
		return err
	}
	prom, err := isTrue("USE_PROMETHEUS")
	if err != nil {
		return err
	}
	dog, err := isTrue("USE_DOG_STATSD")
	if err != nil {
		return err
	}
	statsd := !prom || dog
	if v := getenv("USE_STATSD"); v != "" {
		if statsd, err = isTrue("USE_STATSD"); err != nil {
			return err
		}
	}
	if statsd || dog {
		host, port := getenv("STATSD_HOST"), getenv("STATSD_PORT")
		if host == "" {
			host = "localhost"
		}
		if port == "" {
			port = "8125"
		}
		set("statsd-addr", net.JoinHostPort(host, port))
		if p := getenv("STATSD_PROTOCOL"); p != "" && !dog {
			set("statsd-protocol", strings.ToLower(p))
		}
		if dog {
			set("dogstatsd", "true")
			set("statsd-protocol", "udp")
		}
	}
	if prom {
		addr, path := getenv("PROMETHEUS_ADDR"), getenv("PROMETHEUS_PATH")
		if addr == "" {
			addr = ":9090"
		}
		set("compat-metrics-addr", addr)
		if path != "" {
			set("compat-metrics-path", path)
		}
		if f := getenv("PROMETHEUS_MAPPER_YAML"); f != "" {
			set("compat-metrics-mapper", f)
		}
	}
	return nil
}

// envoyproxyMogrifiers reads the incumbent's DogStatsD mogrifiers:
// USE_DOG_STATSD_MOGRIFIERS=A,B names them, and DOG_STATSD_MOGRIFIER_A_
// PATTERN (a regular expression), _NAME and _TAGS (k:v,k2:v2; $N in
// either stands for the pattern's groups) define each. They apply in the
// order named.
func envoyproxyMogrifiers(getenv func(string) string) ([]compatstats.Mogrifier, error) {
	names := getenv("USE_DOG_STATSD_MOGRIFIERS")
	if names == "" {
		return nil, nil
	}
	var out []compatstats.Mogrifier
	for _, n := range strings.Split(names, ",") {
		n = strings.TrimSpace(n)
		prefix := "DOG_STATSD_MOGRIFIER_" + n + "_"
		pattern, name := getenv(prefix+"PATTERN"), getenv(prefix+"NAME")
		if pattern == "" || name == "" {
			return nil, fmt.Errorf("--env-compat=envoyproxy: mogrifier %s needs %sPATTERN and %sNAME", n, prefix, prefix)
		}
		re, err := regexp.Compile(pattern)
		if err != nil {
			return nil, fmt.Errorf("--env-compat=envoyproxy: %sPATTERN: %w", prefix, err)
		}
		tags, err := parsePairs(getenv(prefix + "TAGS"))
		if err != nil {
			return nil, fmt.Errorf("--env-compat=envoyproxy: %sTAGS: %w", prefix, err)
		}
		out = append(out, compatstats.Mogrifier{Pattern: re, Name: name, Tags: tags})
	}
	return out, nil
}
