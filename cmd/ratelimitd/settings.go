package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/ratelimitd/ratelimitd/config"
	"github.com/ratelimitd/ratelimitd/internal/compatstats"
	"github.com/ratelimitd/ratelimitd/internal/lease"
	"github.com/ratelimitd/ratelimitd/internal/redisstore"
	"github.com/ratelimitd/ratelimitd/internal/rlqs"
	"github.com/ratelimitd/ratelimitd/internal/service"
	"github.com/ratelimitd/ratelimitd/internal/tracing"
	"github.com/ratelimitd/ratelimitd/internal/xds"
)

// envPrefix starts the environment variable that mirrors each flag:
// --redis-url is RATELIMITD_REDIS_URL.
const envPrefix = "RATELIMITD_"

// DefaultGRPCMaxStreams is --grpc-max-concurrent-streams's default: the
// streams one connection may have open at once.
const DefaultGRPCMaxStreams = 100

// settings are the process settings; the rules live in --config.
type settings struct {
	config            string
	mergeDomains      bool
	redisURL          string
	redisPassFile     string
	redisPerSecondURL string
	redisPassword     string   // from --env-compat's REDIS_AUTH
	envCompat         string   // --env-compat
	ignoredEnv        []string // the compat variables set but ignored, with why
	redisURLInArgs    bool     // --redis-url came on the command line, visible to ps
	grpcAddr          string
	httpAddr          string
	localCacheSize    byteSize
	shadowMode        bool
	rlqs              rlqsSettings
	responseHeaders   headersFlag
	redisTimeout      time.Duration
	breakerAfter      time.Duration
	keyPrefix         string
	logLevel          slog.Level
	logFormat         string
	drainDelay        time.Duration
	failureMode       config.FailureMode
	rejectedHits      config.RejectedHits
	usageTimeout      time.Duration
	calendarPeriods   bool
	redisMode         string
	redisTLSCA        string
	redisTLSCert      string
	redisTLSKey       string
	grpcTLSCert       string
	grpcTLSKey        string
	grpcClientCA      string
	grpcMaxMessage    byteSize
	grpcMaxStreams    uint32
	watch             bool
	decisionMeta      bool
	debugAddr         string
	nearLimitRatio    float64
	dispatchers       int
	xds               xdsSettings
	stats             statsSettings
	tracing           tracingSettings
	headerNames       service.HeaderNames
	leaseInterval     time.Duration
}

// statsSettings are the flags of envoyproxy/ratelimit's stats under its
// names: statsd and a Prometheus endpoint of their own.
type statsSettings struct {
	statsdAddr, statsdProtocol, tags string
	dogstatsd                        bool
	mogrifiers                       []compatstats.Mogrifier // from --env-compat's DOG_STATSD_MOGRIFIER_*
	flushInterval                    time.Duration
	compatAddr, compatPath, mapper   string
}

// tracingSettings are the --tracing-* flags: OpenTelemetry traces.
type tracingSettings struct {
	endpoint, protocol                 string
	samplingRate                       float64
	serviceName, namespace, instanceID string
}

// xdsSettings are the --xds-* flags: rules from a management server.
type xdsSettings struct {
	server, nodeID, nodeMeta, headers string
	tls                               bool
	ca, cert, key, serverName         string
	maxMessage                        byteSize
	backoffInitial, backoffMax        time.Duration
	startWithoutRules                 bool
	// beforeRules is the answer while no set has arrived yet (with
	// startWithoutRules): "unavailable" or "ok".
	beforeRules string
}

func newFlagSet(s *settings, out io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("ratelimitd", flag.ContinueOnError)
	fs.SetOutput(out)
	fs.StringVar(&s.config, "config", "", "rules: a YAML file, or a directory of *.yaml/*.yml files (this or --xds-server is required)")
	fs.StringVar(&s.xds.server, "xds-server", "", "rules from this xDS management server (host:port; ADS, State of the World, RateLimitConfig resources) instead of --config")
	fs.StringVar(&s.xds.nodeID, "xds-node-id", xds.DefaultNodeID, "node ID sent to --xds-server")
	fs.StringVar(&s.xds.nodeMeta, "xds-node-metadata", "", "node metadata sent to --xds-server: k=v,k2=v2")
	fs.StringVar(&s.xds.headers, "xds-headers", "", "gRPC metadata sent to --xds-server when the stream opens: k=v,k2=v2")
	fs.BoolVar(&s.xds.tls, "xds-tls", false, "reach --xds-server over TLS (implied by the other --xds-tls-* flags)")
	fs.StringVar(&s.xds.ca, "xds-tls-ca", "", "PEM CA file that signs --xds-server's certificate (default: the system's roots)")
	fs.StringVar(&s.xds.cert, "xds-tls-cert", "", "PEM client certificate for --xds-server (with --xds-tls-key)")
	fs.StringVar(&s.xds.key, "xds-tls-key", "", "PEM client key for --xds-server")
	fs.StringVar(&s.xds.serverName, "xds-tls-server-name", "", "name to verify in --xds-server's certificate (default: its host)")
	s.xds.maxMessage = xds.DefaultMaxMessage
	fs.Var(&s.xds.maxMessage, "xds-max-message-size", "largest response accepted from --xds-server, in bytes (default 4MiB)")
	fs.DurationVar(&s.xds.backoffInitial, "xds-backoff-initial", xds.DefaultBackoffInitial, "first wait before opening the stream to --xds-server again; it doubles, with jitter, up to --xds-backoff-max")
	fs.DurationVar(&s.xds.backoffMax, "xds-backoff-max", xds.DefaultBackoffMax, "longest wait before opening the stream to --xds-server again")
	fs.BoolVar(&s.xds.startWithoutRules, "xds-start-without-rules", false, "serve before --xds-server sent the first valid rules (answered as --xds-before-rules says meanwhile) instead of waiting for them")
	fs.StringVar(&s.xds.beforeRules, "xds-before-rules", "unavailable", "with --xds-start-without-rules, the answer until the first rules arrive: unavailable (gRPC UNAVAILABLE, HTTP 503: Envoy's failure_mode_deny decides, as with envoyproxy/ratelimit) or ok (every request OK, no limit)")
	fs.StringVar(&s.envCompat, "env-compat", "", "read another rate limiter's environment variables beneath ratelimitd's own flags and variables: envoyproxy (see docs/migrating.md; the default when the binary runs as ratelimit) or none")
	fs.BoolVar(&s.mergeDomains, "merge-domains", false, "merge rules files that share a domain (envoyproxy/ratelimit's MERGE_DOMAIN_CONFIG); a descriptor two files define is an error")
	fs.StringVar(&s.redisURL, "redis-url", "", "Redis URL (redis://, rediss://, unix://); empty: the embedded in-memory store, limits per process")
	fs.StringVar(&s.redisPerSecondURL, "redis-persecond-url", "", "a second Redis for the counters of one-second windows (envoyproxy/ratelimit's REDIS_PERSECOND), with --redis-url's mode, TLS files and timeouts; a request spanning both stays all or nothing")
	fs.StringVar(&s.redisPassFile, "redis-password-file", "", "file holding Redis's password (instead of one in --redis-url, which ps shows); a trailing newline is ignored")
	fs.StringVar(&s.grpcAddr, "grpc-addr", ":8081", "gRPC listen address")
	fs.StringVar(&s.httpAddr, "http-addr", ":8080", "HTTP listen address (/json, /healthcheck, /rlconfig)")
	fs.Var(&s.localCacheSize, "local-cache-size", "bytes of local over-limit cache (e.g. 0, 1048576, 64MiB); 0 turns it off")
	fs.BoolVar(&s.rlqs.on, "rlqs", false, "preview: also serve Envoy's Rate Limit Quota Service (envoy.service.rate_limit_quota.v3) on the gRPC port; a domain's rlqs.descriptor_keys turn bucket ids into descriptors")
	fs.IntVar(&s.rlqs.maxStreams, "rlqs-max-streams", rlqs.DefaultMaxStreams, "most RLQS streams open at once; one more is refused with RESOURCE_EXHAUSTED")
	fs.IntVar(&s.rlqs.maxBuckets, "rlqs-max-buckets", rlqs.DefaultMaxBuckets, "most buckets of one RLQS stream; one more gets no assignment (Envoy's no_assignment_behavior decides it)")
	fs.DurationVar(&s.rlqs.margin, "rlqs-margin", rlqs.DefaultMargin, "RLQS grants expire this long before their window ends: how late an Envoy may apply an assignment with the fleet still within the limit")
	fs.DurationVar(&s.rlqs.idleAfter, "rlqs-idle-after", rlqs.DefaultIdleAfter, "abandon RLQS buckets without requests for this long")
	fs.BoolVar(&s.shadowMode, "shadow-mode", false, "global shadow mode: decide and count, but always answer OK overall")
	fs.Var(&s.responseHeaders, "response-headers", "rate-limit headers on responses: legacy (RateLimit-Limit/-Remaining/-Reset; a bare --response-headers), draft11 (RateLimit-Policy and RateLimit), or off")
	fs.StringVar(&s.headerNames.Limit, "response-header-limit", service.HeaderLimit, "name of the legacy style's limit header")
	fs.StringVar(&s.headerNames.Remaining, "response-header-remaining", service.HeaderRemaining, "name of the legacy style's remaining header")
	fs.StringVar(&s.headerNames.Reset, "response-header-reset", service.HeaderReset, "name of the legacy style's reset header")
	fs.DurationVar(&s.leaseInterval, "lease-interval", lease.DefaultInterval, "how long a grant of a leased counter (lease: true) should last at its recent rate: longer means fewer Redis round trips and more hits held per instance")
	fs.DurationVar(&s.redisTimeout, "redis-timeout", redisstore.DefaultTimeout, "bound on each Redis call; a shorter gRPC deadline wins")
	fs.DurationVar(&s.breakerAfter, "breaker-open-after", redisstore.DefaultBreakerOpenAfter, "open the Redis breaker (answer by failure policy at once) only after round trips have kept failing this long, with no answer in between")
	fs.StringVar(&s.keyPrefix, "key-prefix", "", "prefix of every Redis key; changing it starts every counter afresh")
	fs.TextVar(&s.logLevel, "log-level", slog.LevelInfo, "debug, info, warn or error")
	fs.StringVar(&s.logFormat, "log-format", "text", "text or json")
	fs.Func("failure-mode", "allow or deny: the answer, when Redis cannot decide, for rules without their own failure_mode (default allow)", func(v string) error {
		fm, err := config.ParseFailureMode(v)
		s.failureMode = fm
		return err
	})
	fs.Func("rejected-hits", "usage or nothing: what a refused call consumes, for rules without their own rejected_hits (every rule over xDS). usage: a call stating its hits (hits_addend) is a usage charge, recorded even when refused; nothing: a refused call consumes nothing (default usage)", func(v string) error {
		rh, err := config.ParseRejectedHits(v)
		s.rejectedHits = rh
		return err
	})
	fs.BoolVar(&s.calendarPeriods, "calendar-periods", false, "month and year windows of rules without their own calendar (every rule over xDS) are UTC calendar months and years, resetting at their start, instead of 30 and 365 days from the epoch (envoyproxy/ratelimit's count)")
	fs.DurationVar(&s.usageTimeout, "usage-timeout", service.DefaultUsageTimeout, "how long a budget check (a call stating 0 hits) counts as in flight while its usage charge has not come; whole seconds, at least 1s")
	fs.StringVar(&s.redisMode, "redis-mode", "", "single, sentinel or cluster (default: sentinel when --redis-url has master_name, else single)")
	fs.StringVar(&s.redisTLSCA, "redis-tls-ca", "", "PEM file of the CA that signs Redis's certificate (with a rediss:// URL)")
	fs.StringVar(&s.redisTLSCert, "redis-tls-cert", "", "PEM client certificate for Redis (with --redis-tls-key)")
	fs.StringVar(&s.redisTLSKey, "redis-tls-key", "", "PEM client key for Redis")
	fs.StringVar(&s.grpcTLSCert, "grpc-tls-cert", "", "PEM certificate: serve gRPC over TLS (with --grpc-tls-key)")
	fs.StringVar(&s.grpcTLSKey, "grpc-tls-key", "", "PEM key of --grpc-tls-cert")
	fs.StringVar(&s.grpcClientCA, "grpc-client-ca", "", "PEM CA file: require and verify client certificates (mTLS)")
	s.grpcMaxMessage = 1 << 20
	fs.Var(&s.grpcMaxMessage, "grpc-max-message-size", "largest gRPC request accepted, in bytes (default 1MiB)")
	fs.Func("grpc-max-concurrent-streams", "streams one gRPC connection may have open at once; more are refused (default 100)", func(v string) error {
		n, err := strconv.ParseUint(v, 10, 32)
		if err != nil || n == 0 {
			return fmt.Errorf("want a whole number from 1 to %d, got %q", uint32(math.MaxUint32), v)
		}
		s.grpcMaxStreams = uint32(n)
		return nil
	})
	s.grpcMaxStreams = DefaultGRPCMaxStreams
	fs.IntVar(&s.dispatchers, "redis-dispatchers", 1, "batching dispatchers, each sending what queued during its previous round trip as one script call (one per hash slot on Cluster); -1: no batching, one round trip per request")
	fs.BoolVar(&s.watch, "watch", true, "reload the rules when files under --config change (SIGHUP always reloads)")
	fs.BoolVar(&s.decisionMeta, "decision-metadata", false, "explain each decision in the response's dynamic_metadata (rule and reason per descriptor)")
	fs.StringVar(&s.debugAddr, "debug-addr", "", "serve pprof on this address (e.g. 127.0.0.1:6060); empty: off")
	fs.Float64Var(&s.nearLimitRatio, "near-limit-ratio", 0.8, "share of a limit from which an OK decision counts as near_limit in metrics")
	fs.DurationVar(&s.drainDelay, "drain-delay", 0, "on SIGTERM, keep serving this long with health NOT_SERVING before stopping")
	fs.StringVar(&s.tracing.endpoint, "tracing-endpoint", "", "export OpenTelemetry traces of decisions to this OTLP collector (host:port, or a URL); empty: off")
	fs.StringVar(&s.tracing.protocol, "tracing-protocol", "grpc", "grpc or http (OTLP/HTTP, protobuf), for --tracing-endpoint")
	fs.Float64Var(&s.tracing.samplingRate, "tracing-sampling-rate", 1, "share of the traces started here that are kept (0 to 1); a caller's sampling decision is always followed")
	fs.StringVar(&s.tracing.serviceName, "tracing-service-name", tracing.DefaultServiceName, "service.name of the spans")
	fs.StringVar(&s.tracing.namespace, "tracing-service-namespace", "", "service.namespace of the spans")
	fs.StringVar(&s.tracing.instanceID, "tracing-service-instance-id", "", "service.instance.id of the spans")
	fs.StringVar(&s.stats.statsdAddr, "statsd-addr", "", "send envoyproxy/ratelimit's stats, under its names, to this statsd server (host:port); empty: none")
	fs.StringVar(&s.stats.statsdProtocol, "statsd-protocol", "tcp", "tcp or udp, for --statsd-addr")
	fs.BoolVar(&s.stats.dogstatsd, "dogstatsd", false, "send to --statsd-addr in DogStatsD form (UDP, tags as |#k:v) with DataDog's client")
	fs.StringVar(&s.stats.tags, "statsd-tags", "", "tags on every envoyproxy/ratelimit stat, k:v,k2:v2 (gostats' .__k=v in statsd names; labels on --compat-metrics-addr)")
	fs.DurationVar(&s.stats.flushInterval, "stats-flush-interval", compatstats.DefaultFlushInterval, "how often envoyproxy/ratelimit's stats are sent to --statsd-addr and --compat-metrics-addr")
	fs.StringVar(&s.stats.compatAddr, "compat-metrics-addr", "", "serve envoyproxy/ratelimit's stats as Prometheus metrics under its names (ratelimit_service_rate_limit_*) on this address; empty: off")
	fs.StringVar(&s.stats.compatPath, "compat-metrics-path", "/metrics", "path of --compat-metrics-addr")
	fs.StringVar(&s.stats.mapper, "compat-metrics-mapper", "", "statsd_exporter mapping file naming --compat-metrics-addr's metrics (default: envoyproxy/ratelimit's built-in mapping)")
	return fs
}

// parseSettings reads the environment, then the flags, which win.
func parseSettings(args []string, getenv func(string) string, out io.Writer) (*settings, error) {
	s := &settings{}
	fs := newFlagSet(s, out)
	// Another limiter's variables come first, so that ratelimitd's own
	// variables and then its flags win over them.
	if compat := compatFrom(args, getenv); compat != "" && compat != "none" {
		if compat != "envoyproxy" {
			return nil, fmt.Errorf("--env-compat %q: want envoyproxy or none", compat)
		}
		flags, password, ignored, err := envoyproxyEnv(getenv)
		if err != nil {
			return nil, err
		}
		if s.stats.mogrifiers, err = envoyproxyMogrifiers(getenv); err != nil {
			return nil, err
		}
		for _, f := range flags {
			if err := fs.Set(f[0], f[1]); err != nil {
				return nil, fmt.Errorf("--env-compat=envoyproxy: --%s=%q: %w", f[0], redisstore.Redact(f[1]), err)
			}
		}
		s.redisPassword, s.ignoredEnv = password, ignored
	}
	var errs []error
	fs.VisitAll(func(f *flag.Flag) {
		name := envPrefix + strings.ToUpper(strings.ReplaceAll(f.Name, "-", "_"))
		if v := getenv(name); v != "" {
			if err := fs.Set(f.Name, v); err != nil {
				errs = append(errs, fmt.Errorf("%s=%q: %w", name, v, err))
			}
		}
	})
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected argument %q (flags only; see -h)", redisstore.Redact(fs.Arg(0)))
	}
	for _, a := range args {
		if name, _, _ := strings.Cut(strings.TrimLeft(a, "-"), "="); name == "redis-url" && strings.HasPrefix(a, "-") {
			s.redisURLInArgs = true
		}
	}
	switch {
	case s.config == "" && s.xds.server == "":
		return nil, errors.New("--config is required (a rules file or directory; env " + envPrefix + "CONFIG), or --xds-server")
	case s.config != "" && s.xds.server != "":
		return nil, errors.New("--config and --xds-server both give the rules: use one")
	case s.rlqs.maxStreams < 1 || s.rlqs.maxBuckets < 1:
		return nil, fmt.Errorf("--rlqs-max-streams (%d) and --rlqs-max-buckets (%d) must be at least 1", s.rlqs.maxStreams, s.rlqs.maxBuckets)
	case s.rlqs.margin <= 0 || s.rlqs.margin > time.Minute:
		return nil, fmt.Errorf("--rlqs-margin %v: want more than 0, at most 1m", s.rlqs.margin)
	case s.rlqs.idleAfter < rlqs.ReportPeriod:
		return nil, fmt.Errorf("--rlqs-idle-after %v: want at least %v (Envoy reports every 5 s)", s.rlqs.idleAfter, rlqs.ReportPeriod)
	case s.xds.beforeRules != "unavailable" && s.xds.beforeRules != "ok":
		return nil, fmt.Errorf("--xds-before-rules %q: want unavailable or ok", s.xds.beforeRules)
	case s.xds.server == "" && (s.xds.tls || s.xds.ca != "" || s.xds.cert != "" || s.xds.serverName != "" || s.xds.nodeMeta != "" || s.xds.headers != "" || s.xds.startWithoutRules):
		return nil, errors.New("--xds-* need --xds-server")
	case (s.xds.cert == "") != (s.xds.key == ""):
		return nil, errors.New("--xds-tls-cert and --xds-tls-key go together")
	case s.xds.backoffInitial <= 0 || s.xds.backoffMax < s.xds.backoffInitial:
		return nil, fmt.Errorf("--xds-backoff-initial (%v) must be positive and at most --xds-backoff-max (%v)", s.xds.backoffInitial, s.xds.backoffMax)
	case s.xds.maxMessage < 1024:
		return nil, fmt.Errorf("--xds-max-message-size must be at least 1024, got %d", s.xds.maxMessage)
	case s.usageTimeout < time.Second || s.usageTimeout > 24*time.Hour || s.usageTimeout%time.Second != 0:
		return nil, fmt.Errorf("--usage-timeout must be whole seconds from 1s to 24h, got %v", s.usageTimeout)
	case s.leaseInterval < time.Millisecond || s.leaseInterval > time.Minute:
		return nil, fmt.Errorf("--lease-interval must be from 1ms to 1m, got %v", s.leaseInterval)
	case s.redisTimeout <= 0:
		return nil, fmt.Errorf("--redis-timeout must be positive, got %v", s.redisTimeout)
	case s.breakerAfter <= 0:
		return nil, fmt.Errorf("--breaker-open-after must be positive, got %v", s.breakerAfter)
	case s.logFormat != "text" && s.logFormat != "json":
		return nil, fmt.Errorf("--log-format must be text or json, got %q", s.logFormat)
	case (s.grpcTLSCert == "") != (s.grpcTLSKey == ""):
		return nil, errors.New("--grpc-tls-cert and --grpc-tls-key go together")
	case s.grpcClientCA != "" && s.grpcTLSCert == "":
		return nil, errors.New("--grpc-client-ca needs --grpc-tls-cert and --grpc-tls-key")
	case s.grpcMaxMessage < 1024:
		return nil, fmt.Errorf("--grpc-max-message-size must be at least 1024, got %d", s.grpcMaxMessage)
	case s.redisURL == "" && (s.redisMode != "" || s.redisTLSCA != "" || s.redisTLSCert != "" || s.redisPassFile != "" || s.redisPerSecondURL != ""):
		return nil, errors.New("--redis-mode, --redis-password-file, --redis-persecond-url and --redis-tls-* need --redis-url")
	case s.redisMode != "" && s.redisMode != redisstore.ModeSingle && s.redisMode != redisstore.ModeSentinel && s.redisMode != redisstore.ModeCluster:
		return nil, fmt.Errorf("--redis-mode %q: want single, sentinel or cluster", s.redisMode)
	case (s.redisTLSCert == "") != (s.redisTLSKey == ""):
		return nil, errors.New("--redis-tls-cert and --redis-tls-key go together")
	case (s.redisTLSCA != "" || s.redisTLSCert != "") && (!strings.HasPrefix(s.redisURL, "rediss://") ||
		s.redisPerSecondURL != "" && !strings.HasPrefix(s.redisPerSecondURL, "rediss://")):
		return nil, errors.New("--redis-tls-* need rediss:// Redis URLs")
	case s.nearLimitRatio <= 0 || s.nearLimitRatio > 1:
		return nil, fmt.Errorf("--near-limit-ratio must be in (0, 1], got %v", s.nearLimitRatio)
	case s.drainDelay < 0:
		return nil, fmt.Errorf("--drain-delay must not be negative, got %v", s.drainDelay)
	case s.stats.statsdProtocol != "tcp" && s.stats.statsdProtocol != "udp":
		return nil, fmt.Errorf("--statsd-protocol %q: want tcp or udp", s.stats.statsdProtocol)
	case s.stats.dogstatsd && s.stats.statsdAddr == "":
		return nil, errors.New("--dogstatsd needs --statsd-addr")
	case s.tracing.protocol != "grpc" && s.tracing.protocol != "http":
		return nil, fmt.Errorf("--tracing-protocol %q: want grpc or http", s.tracing.protocol)
	case s.tracing.samplingRate < 0 || s.tracing.samplingRate > 1:
		return nil, fmt.Errorf("--tracing-sampling-rate must be from 0 to 1, got %v", s.tracing.samplingRate)
	case s.stats.flushInterval <= 0:
		return nil, fmt.Errorf("--stats-flush-interval must be positive, got %v", s.stats.flushInterval)
	case !strings.HasPrefix(s.stats.compatPath, "/"):
		return nil, fmt.Errorf("--compat-metrics-path %q must start with /", s.stats.compatPath)
	case s.stats.mapper != "" && s.stats.compatAddr == "":
		return nil, errors.New("--compat-metrics-mapper needs --compat-metrics-addr")
	}
	for _, h := range []struct{ flag, v string }{{"--response-header-limit", s.headerNames.Limit},
		{"--response-header-remaining", s.headerNames.Remaining}, {"--response-header-reset", s.headerNames.Reset}} {
		if !service.ValidHeaderName(h.v) {
			return nil, fmt.Errorf("%s %q: not an HTTP header name", h.flag, h.v)
		}
	}
	for _, kv := range []struct{ flag, v string }{{"--xds-node-metadata", s.xds.nodeMeta}, {"--xds-headers", s.xds.headers}, {"--statsd-tags", s.stats.tags}} {
		if _, err := parsePairs(kv.v); err != nil {
			return nil, fmt.Errorf("%s: %w", kv.flag, err)
		}
	}
	return s, nil
}

// parsePairs reads "k=v,k2=v2" (or "k:v,...", as the incumbent writes
// its maps): each pair splits at its first '=' or ':'.
func parsePairs(s string) (map[string]string, error) {
	if strings.TrimSpace(s) == "" {
		return nil, nil
	}
	out := map[string]string{}
	for _, p := range strings.Split(s, ",") {
		i := strings.IndexAny(p, "=:")
		if i <= 0 {
			return nil, fmt.Errorf("want k=v,k2=v2, got %q", p)
		}
		out[strings.TrimSpace(p[:i])] = strings.TrimSpace(p[i+1:])
	}
	return out, nil
}

// compatFrom finds --env-compat before the flags are parsed: on the
// command line, else in RATELIMITD_ENV_COMPAT.
func compatFrom(args []string, getenv func(string) string) string {
	v := getenv(envPrefix + "ENV_COMPAT")
	for i, a := range args {
		name, val, hasVal := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if name != "env-compat" || !strings.HasPrefix(a, "-") {
			continue
		}
		switch {
		case hasVal:
			v = val
		case i+1 < len(args):
			v = args[i+1]
		}
	}
	return v
}

// byteSize is a byte count with an optional KiB, MiB or GiB suffix.
type byteSize int

func (b *byteSize) String() string { return strconv.Itoa(int(*b)) }

func (b *byteSize) Set(s string) error {
	mult := 1
	num := strings.TrimSpace(s)
	for _, u := range []struct {
		suffix string
		mult   int
	}{{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}} {
		if v, ok := strings.CutSuffix(num, u.suffix); ok {
			num, mult = strings.TrimSpace(v), u.mult
			break
		}
	}
	n, err := strconv.Atoi(num)
	if err != nil || n < 0 || n > (1<<40)/mult {
		return fmt.Errorf("want a byte count such as 0, 1048576 or 64MiB, got %q", s)
	}
	*b = byteSize(n * mult)
	return nil
}

// headersFlag is the header style. A bare --response-headers means legacy,
// as does true; false means off.
type headersFlag service.HeaderStyle

func (h *headersFlag) String() string {
	switch service.HeaderStyle(*h) {
	case service.HeadersLegacy:
		return "legacy"
	case service.HeadersDraft11:
		return "draft11"
	}
	return "off"
}

func (h *headersFlag) IsBoolFlag() bool { return true }

func (h *headersFlag) Set(s string) error {
	switch strings.ToLower(s) {
	case "legacy", "true", "1":
		*h = headersFlag(service.HeadersLegacy)
	case "draft11":
		*h = headersFlag(service.HeadersDraft11)
	case "off", "false", "0":
		*h = headersFlag(service.HeadersOff)
	default:
		return fmt.Errorf("want legacy, draft11 or off, got %q", s)
	}
	return nil
}

// rlqsSettings are the --rlqs flags.
type rlqsSettings struct {
	on                     bool
	maxStreams, maxBuckets int
	margin, idleAfter      time.Duration
}
