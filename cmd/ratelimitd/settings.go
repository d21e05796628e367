package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/ratelimitd/ratelimitd/config"
	"github.com/ratelimitd/ratelimitd/internal/global"
	"github.com/ratelimitd/ratelimitd/internal/incumbentenv"
	"github.com/ratelimitd/ratelimitd/internal/incumbentstats"
	"github.com/ratelimitd/ratelimitd/internal/lease"
	"github.com/ratelimitd/ratelimitd/internal/record"
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

// settings are the process settings, parsed once: flags bind straight to
// the components' Options where they are one field each; the rules live in
// --config.
type settings struct {
	config            string
	mergeDomains      bool
	watch             bool
	redisURL          string
	redisPassFile     string
	redisPerSecondURL string
	redisPassword     string   // from --env-compat's REDIS_AUTH
	envCompat         string   // --env-compat
	ignoredEnv        []string // the compat variables set but ignored, with why
	unknownEnv        []string // RATELIMITD_ variables set that no flag reads
	ignoredArgs       []string // under --env-compat=envoyproxy, the arguments that are not ratelimitd's
	redisURLInArgs    bool     // --redis-url came on the command line, visible to ps
	grpcAddr          string
	httpAddr          string
	debugAddr         string
	localCacheSize    byteSize
	journalSize       byteSize
	journalSizeSet    bool        // --charge-journal-size given, by a flag or a variable
	journal           journalFlag // --charge-journal
	responseHeaders   headersFlag
	logLevel          slog.Level
	logFormat         string
	drainDelay        time.Duration
	redisTLSCA        string
	redisTLSCert      string
	redisTLSKey       string
	grpcTLSCert       string
	grpcTLSKey        string
	grpcClientCA      string
	grpcMaxMessage    byteSize
	grpcMaxStreams    uint32
	// The components' own options: what the flags set of them.
	svc    service.Options
	redis  redisstore.Options // Mode, Timeout, BreakerOpenAfter, Dispatchers
	lease  lease.Options      // Interval
	global global.Options     // Refresh, OutAfter, Share
	// globalURL is the home Redis of global limits (--global-redis-url);
	// globalPolicy its partition policy.
	globalURL, globalPolicy string
	// globalDomains is --global-domains: the domains whose every limit
	// is global, comma-separated.
	globalDomains string
	rlqsOn        bool
	rlqs          rlqs.Options
	tracing       tracing.Options
	xds           xdsSettings
	stats         statsSettings
}

// statsSettings are the flags of envoyproxy/ratelimit's stats under its
// names: statsd and a Prometheus endpoint of their own.
type statsSettings struct {
	opts                           incumbentstats.Options // the statsd sink, tags, flush interval
	tags                           pairs
	compatAddr, compatPath, mapper string
}

// xdsSettings are the --xds-* flags: rules from a management server.
type xdsSettings struct {
	opts                      xds.Options // server, node, backoff, message size
	nodeMeta, headers         pairs
	tls                       bool
	ca, cert, key, serverName string
	maxMessage                byteSize
	startWithoutRules         bool
	// beforeRules is the answer while no set has arrived yet (with
	// startWithoutRules): "unavailable" or "ok".
	beforeRules string
}

func newFlagSet(s *settings, out io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("ratelimitd", flag.ContinueOnError)
	fs.SetOutput(out)
	fs.Usage = serverUsage(fs)
	for _, add := range []func(*flag.FlagSet, *settings){rulesFlags, xdsFlags, redisFlags, globalFlags, serveFlags, decisionFlags, rlqsFlags, tracingFlags, statsFlags} {
		add(fs, s)
	}
	explainValues(fs)
	return fs
}

func rulesFlags(fs *flag.FlagSet, s *settings) {
	fs.StringVar(&s.config, "config", "", "rules: a YAML file, or a directory of *.yaml/*.yml files (this or --xds-server is required)")
	fs.BoolVar(&s.mergeDomains, "merge-domains", false, "merge rules files that share a domain (envoyproxy/ratelimit's MERGE_DOMAIN_CONFIG); a descriptor two files define is an error")
	fs.BoolVar(&s.watch, "watch", true, "reload the rules when files under --config change (SIGHUP always reloads)")
	fs.StringVar(&s.envCompat, "env-compat", "", "read another rate limiter's environment variables beneath ratelimitd's own flags and variables: envoyproxy (see docs/migrating.md; the default when the binary runs as ratelimit) or none")
}

func xdsFlags(fs *flag.FlagSet, s *settings) {
	x := &s.xds
	fs.StringVar(&x.opts.Server, "xds-server", "", "rules from this xDS management server (host:port; ADS, State of the World, RateLimitConfig resources) instead of --config")
	fs.StringVar(&x.opts.NodeID, "xds-node-id", xds.DefaultNodeID, "node ID sent to --xds-server")
	fs.Var(&x.nodeMeta, "xds-node-metadata", "node metadata sent to --xds-server: k=v,k2=v2")
	fs.Var(&x.headers, "xds-headers", "gRPC metadata sent to --xds-server when the stream opens: k=v,k2=v2")
	fs.BoolVar(&x.tls, "xds-tls", false, "reach --xds-server over TLS (implied by the other --xds-tls-* flags)")
	fs.StringVar(&x.ca, "xds-tls-ca", "", "PEM CA file that signs --xds-server's certificate (default: the system's roots)")
	fs.StringVar(&x.cert, "xds-tls-cert", "", "PEM client certificate for --xds-server (with --xds-tls-key)")
	fs.StringVar(&x.key, "xds-tls-key", "", "PEM client key for --xds-server")
	fs.StringVar(&x.serverName, "xds-tls-server-name", "", "name to verify in --xds-server's certificate (default: its host)")
	x.maxMessage = xds.DefaultMaxMessage
	fs.Var(&x.maxMessage, "xds-max-message-size", "largest response accepted from --xds-server, in bytes")
	fs.Var(positive(&x.opts.BackoffInitial, xds.DefaultBackoffInitial), "xds-backoff-initial", "first wait before opening the stream to --xds-server again; it doubles, with jitter, up to --xds-backoff-max")
	fs.Var(positive(&x.opts.BackoffMax, xds.DefaultBackoffMax), "xds-backoff-max", "longest wait before opening the stream to --xds-server again")
	fs.BoolVar(&x.startWithoutRules, "xds-start-without-rules", false, "serve before --xds-server sent the first valid rules (answered as --xds-before-rules says meanwhile) instead of waiting for them")
	fs.StringVar(&x.beforeRules, "xds-before-rules", "unavailable", "with --xds-start-without-rules, the answer until the first rules arrive: unavailable (gRPC UNAVAILABLE, HTTP 503: Envoy's failure_mode_deny decides, as with envoyproxy/ratelimit) or ok (every request OK, no limit)")
}

func redisFlags(fs *flag.FlagSet, s *settings) {
	fs.StringVar(&s.redisURL, "redis-url", "", "Redis URL (redis://, rediss://, unix://); empty: the embedded in-memory store, limits per process")
	fs.StringVar(&s.redisPerSecondURL, "redis-persecond-url", "", "a second Redis for the counters of one-second windows (envoyproxy/ratelimit's REDIS_PERSECOND), with --redis-url's mode, TLS files and timeouts; a request spanning both stays all or nothing")
	fs.BoolVar(&s.svc.CarryIncumbent, "carry-incumbent-counts", false, "start each fixed-window counter from envoyproxy/ratelimit's count of the same descriptor and window (its key: <--key-prefix><domain>_<key>_<value>_..._<window start>) the first time this instance writes it in a window, so that a swap or a rolling update does not hand out a fresh budget; single or Sentinel Redis only; on by default under --env-compat=envoyproxy with a single or Sentinel Redis (see docs/migrating.md)")
	fs.StringVar(&s.redisPassFile, "redis-password-file", "", "file holding Redis's password (instead of one in --redis-url, which ps shows); a trailing newline is ignored")
	fs.StringVar(&s.redis.Mode, "redis-mode", "", "single, sentinel or cluster (default: sentinel when --redis-url has master_name, else single)")
	fs.StringVar(&s.redisTLSCA, "redis-tls-ca", "", "PEM file of the CA that signs Redis's certificate (with a rediss:// URL)")
	fs.StringVar(&s.redisTLSCert, "redis-tls-cert", "", "PEM client certificate for Redis (with --redis-tls-key)")
	fs.StringVar(&s.redisTLSKey, "redis-tls-key", "", "PEM client key for Redis")
	fs.Var(positive(&s.redis.Timeout, redisstore.DefaultTimeout), "redis-timeout", "bound on each Redis call; a shorter gRPC deadline wins")
	fs.Var(positive(&s.redis.BreakerOpenAfter, redisstore.DefaultBreakerOpenAfter), "breaker-open-after", "open the Redis breaker (answer by failure policy at once) only after round trips have kept failing this long, with no answer in between")
	fs.IntVar(&s.redis.Dispatchers, "redis-dispatchers", 1, "batching dispatchers, each sending what queued during its previous round trip as one script call (one per hash slot on Cluster); -1: no batching, one round trip per request")
	fs.Var(&s.journal, "charge-journal", "auto, on or off: keep each usage charge until a Redis replica acknowledges it, applying the unacknowledged ones again when the master changes (a Sentinel or Cluster failover, a restart), and keep one Redis could not take (down, hung, failing over) to apply when it answers: spend survives, each charge counted once (a mark beside its counter); auto: on with Redis of every topology, off on the in-memory store (see docs/token-budgets.md) (default auto)")
	s.journalSize = redisstore.DefaultJournalBytes
	fs.Var(&s.journalSize, "charge-journal-size", "bytes the charge journal may hold (about 160 and the key a charge); past it the oldest unacknowledged charges are forgotten, counted")
	fs.Var(positive(&s.lease.Interval, lease.DefaultInterval), "lease-interval", "how long a grant of a leased counter (lease: true) should last at its recent rate: longer means fewer Redis round trips and more hits held per instance")
	fs.StringVar(&s.svc.KeyPrefix, "key-prefix", "", "prefix of every Redis key; changing it starts every counter afresh")
}

func globalFlags(fs *flag.FlagSet, s *settings) {
	g := &s.global
	fs.StringVar(&s.globalURL, "global-redis-url", "", "the home Redis of global limits (rate_limit.global: one limit across regions; docs/regions.md): each instance decides them in process from grants drawn from it ahead of need, never more than the limit over all regions; empty: global rules are ordinary ones")
	fs.StringVar(&s.globalDomains, "global-domains", "", "comma-separated domains every limit of which is global, as if each said rate_limit.global (a name, or a prefix ending in '*'): how rules served over xDS by Envoy Gateway (a listener's or gateway's name) or Envoy AI Gateway (ai-gateway-quota) become global; needs --global-redis-url")
	fs.Var(positive(&g.Refresh, global.DefaultRefresh), "global-refresh", "how often grants of global limits are topped up, and how long what is held should last at the demand seen (plus the home's round trip)")
	fs.StringVar(&s.globalPolicy, "global-partition", "deny", "once what is held is spent and the home Redis cannot be reached: deny (refuse: never over the limit) or share (decide in this region's Redis against --global-partition-share of the limit per window)")
	fs.Float64Var(&g.Share, "global-partition-share", 0, "with --global-partition share: this region's share of each global limit while the home is out (0 to 1); all regions may then admit up to the limit plus the sum of their shares a window")
	g.OutAfter = 2 * global.DefaultHomeTimeout
	fs.Var(positive(&g.OutAfter, 2*global.DefaultHomeTimeout), "global-out-after", "how long calls to the home Redis must keep failing before --global-partition answers")
}

func serveFlags(fs *flag.FlagSet, s *settings) {
	fs.StringVar(&s.grpcAddr, "grpc-addr", ":8081", "gRPC listen address")
	fs.StringVar(&s.httpAddr, "http-addr", ":8080", "HTTP listen address (/json, /healthcheck, /rlconfig, /metrics)")
	fs.StringVar(&s.debugAddr, "debug-addr", "", "serve pprof on this address (e.g. 127.0.0.1:6060); empty: off")
	fs.TextVar(&s.logLevel, "log-level", slog.LevelInfo, "debug, info, warn or error")
	fs.StringVar(&s.logFormat, "log-format", "text", "text or json")
	fs.DurationVar(&s.drainDelay, "drain-delay", 0, "on SIGTERM, keep serving this long with health NOT_SERVING before stopping")
	fs.StringVar(&s.grpcTLSCert, "grpc-tls-cert", "", "PEM certificate: serve gRPC over TLS (with --grpc-tls-key)")
	fs.StringVar(&s.grpcTLSKey, "grpc-tls-key", "", "PEM key of --grpc-tls-cert")
	fs.StringVar(&s.grpcClientCA, "grpc-client-ca", "", "PEM CA file: require and verify client certificates (mTLS)")
	s.grpcMaxMessage = 1 << 20
	fs.Var(&s.grpcMaxMessage, "grpc-max-message-size", "largest gRPC request accepted, in bytes")
	s.grpcMaxStreams = DefaultGRPCMaxStreams
	fs.Func("grpc-max-concurrent-streams", "streams one gRPC connection may have open at once; more are refused (default 100)", func(v string) error {
		n, err := strconv.ParseUint(v, 10, 32)
		if err != nil || n == 0 {
			return fmt.Errorf("want a whole number from 1 to %d, got %q", uint32(math.MaxUint32), v)
		}
		s.grpcMaxStreams = uint32(n)
		return nil
	})
}

func decisionFlags(fs *flag.FlagSet, s *settings) {
	o := &s.svc
	fs.Var(&s.localCacheSize, "local-cache-size", "bytes of local over-limit cache (e.g. 0, 1048576, 64MiB); 0 turns it off")
	fs.BoolVar(&o.ShadowMode, "shadow-mode", false, "global shadow mode: decide and count, but always answer OK overall")
	fs.Var(&s.responseHeaders, "response-headers", "rate-limit headers on responses: legacy (RateLimit-Limit/-Remaining/-Reset; a bare --response-headers), draft11 (RateLimit-Policy and RateLimit), or off")
	fs.StringVar(&o.HeaderNames.Limit, "response-header-limit", service.HeaderLimit, "name of the legacy style's limit header")
	fs.StringVar(&o.HeaderNames.Remaining, "response-header-remaining", service.HeaderRemaining, "name of the legacy style's remaining header")
	fs.StringVar(&o.HeaderNames.Reset, "response-header-reset", service.HeaderReset, "name of the legacy style's reset header")
	fs.Func("failure-mode", "allow or deny: the answer, when Redis cannot decide, for rules without their own failure_mode (default allow)", func(v string) error {
		fm, err := config.ParseFailureMode(v)
		o.FailureMode = fm
		return err
	})
	fs.Func("rejected-hits", "usage or nothing: what a refused call consumes, for rules without their own rejected_hits (every rule over xDS). usage: a call stating its hits (hits_addend) is a usage charge, recorded even when refused; nothing: a refused call consumes nothing (default usage)", func(v string) error {
		rh, err := config.ParseRejectedHits(v)
		o.RejectedHits = rh
		return err
	})
	fs.Func("budgets", "auto or off: whether a call may be read as a token budget's check (docs/token-budgets.md). auto: on a counter a usage charge was recorded on, a call stating 0, 1 or no hits is a budget check; off: never, every call is a plain request or read, and a stream end's hits are recorded as a charge that teaches nothing (default auto)", func(v string) error {
		switch v {
		case "auto":
			o.NoBudgets = false
		case "off":
			o.NoBudgets = true
		default:
			return fmt.Errorf("want auto or off, got %q", v)
		}
		return nil
	})
	fs.BoolVar(&o.CalendarPeriods, "calendar-periods", false, "month and year windows of rules without their own calendar (every rule over xDS) are UTC calendar months and years, resetting at their start, instead of 30 and 365 days from the epoch (envoyproxy/ratelimit's count)")
	fs.Var(positive(&o.UsageTimeout, service.DefaultUsageTimeout), "usage-timeout", "the longest a budget check (a call stating 0 hits) counts as in flight while its usage charge has not come: the ceiling of the horizon learned from how long streams last (twice their duration); whole seconds, at least 1s")
	fs.BoolVar(&o.DecisionMetadata, "decision-metadata", false, "explain each decision in the response's dynamic_metadata (rule and reason per descriptor, under \"decisions\")")
	fs.BoolVar(&o.ResponseMetadata, "response-dynamic-metadata", false, "return envoyproxy/ratelimit's RESPONSE_DYNAMIC_METADATA in the response's dynamic_metadata: the domain, each descriptor's entries (and hitsAddend, limit), the request's hitsAddend, and the metadata of the rules of the descriptors answered OK, merged; beside --decision-metadata's \"decisions\"")
	fs.Var(positiveRatio(&o.NearLimitRatio, record.DefaultNearLimitRatio), "near-limit-ratio", "share of a limit from which an OK decision counts as near_limit in metrics")
}

func rlqsFlags(fs *flag.FlagSet, s *settings) {
	o := &s.rlqs
	fs.BoolVar(&s.rlqsOn, "rlqs", false, "preview: also serve Envoy's Rate Limit Quota Service (envoy.service.rate_limit_quota.v3) on the gRPC port; a domain's rlqs.descriptor_keys turn bucket ids into descriptors")
	fs.Var(positiveInt(&o.MaxStreams, rlqs.DefaultMaxStreams), "rlqs-max-streams", "most RLQS streams open at once; one more is refused with RESOURCE_EXHAUSTED")
	fs.Var(positiveInt(&o.MaxBuckets, rlqs.DefaultMaxBuckets), "rlqs-max-buckets", "most buckets of one RLQS stream; one more gets no assignment (Envoy's no_assignment_behavior decides it)")
	fs.Var(positive(&o.Margin, rlqs.DefaultMargin), "rlqs-margin", "RLQS grants expire this long before their window ends: how late an Envoy may apply an assignment with the fleet still within the limit")
	fs.Var(positive(&o.IdleAfter, rlqs.DefaultIdleAfter), "rlqs-idle-after", "abandon RLQS buckets without requests for this long")
}

func tracingFlags(fs *flag.FlagSet, s *settings) {
	o := &s.tracing
	fs.StringVar(&o.Endpoint, "tracing-endpoint", "", "export OpenTelemetry traces of decisions to this OTLP collector (host:port, or a URL); empty: off")
	fs.StringVar(&o.Protocol, "tracing-protocol", "grpc", "grpc or http (OTLP/HTTP, protobuf), for --tracing-endpoint")
	fs.Float64Var(&o.SamplingRate, "tracing-sampling-rate", 1, "share of the traces started here that are kept (0 to 1); a caller's sampling decision is always followed")
	fs.StringVar(&o.ServiceName, "tracing-service-name", tracing.DefaultServiceName, "service.name of the spans")
	fs.StringVar(&o.ServiceNamespace, "tracing-service-namespace", "", "service.namespace of the spans")
	fs.StringVar(&o.InstanceID, "tracing-service-instance-id", "", "service.instance.id of the spans")
}

func statsFlags(fs *flag.FlagSet, s *settings) {
	st := &s.stats
	fs.StringVar(&st.opts.StatsdAddr, "statsd-addr", "", "send envoyproxy/ratelimit's stats, under its names, to this statsd server (host:port); empty: none")
	fs.StringVar(&st.opts.StatsdProtocol, "statsd-protocol", "tcp", "tcp or udp, for --statsd-addr")
	fs.BoolVar(&st.opts.DogStatsd, "dogstatsd", false, "send to --statsd-addr in DogStatsD form (UDP, tags as |#k:v) with DataDog's client")
	fs.Var(&st.tags, "statsd-tags", "tags on every envoyproxy/ratelimit stat, k:v,k2:v2 (gostats' .__k=v in statsd names; labels on --compat-metrics-addr)")
	fs.Var(positive(&st.opts.FlushInterval, incumbentstats.DefaultFlushInterval), "stats-flush-interval", "how often envoyproxy/ratelimit's stats are sent to --statsd-addr and --compat-metrics-addr")
	fs.StringVar(&st.compatAddr, "compat-metrics-addr", "", "serve envoyproxy/ratelimit's stats as Prometheus metrics under its names (ratelimit_service_rate_limit_*) on this address; empty: off")
	fs.StringVar(&st.compatPath, "compat-metrics-path", "/metrics", "path of --compat-metrics-addr")
	fs.StringVar(&st.mapper, "compat-metrics-mapper", "", "statsd_exporter mapping file naming --compat-metrics-addr's metrics (default: envoyproxy/ratelimit's built-in mapping)")
}

// parseSettings reads another limiter's environment, then ratelimitd's
// own variables, then the flags, each winning over the one before, and
// validates the result. Help asked for is printed to out
// (flag.ErrHelp).
func parseSettings(args []string, getenv func(string) string, out io.Writer) (*settings, error) {
	s := &settings{}
	fs := newFlagSet(s, out)
	if err := s.applyEnvCompat(fs, compatFrom(args, getenv), getenv); err != nil {
		return nil, err
	}
	if err := applyEnv(fs, getenv); err != nil {
		return nil, err
	}
	s.unknownEnv = unknownEnv(fs, getenv)
	args = joinEnumValues(fs, args)
	if compatFrom(args, getenv) == "envoyproxy" {
		args, s.ignoredArgs = knownArgs(fs, args)
	}
	if err := parseFlags(fs, "ratelimitd", args, out); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, unexpectedArg(fs, args)
	}
	s.journalSizeSet = isSet(fs, "charge-journal-size")
	if compatFrom(args, getenv) == "envoyproxy" && !isSet(fs, "carry-incumbent-counts") && s.redisURL != "" && s.redis.Mode != redisstore.ModeCluster {
		// Run as the incumbent's image, the swap keeps its counts: a
		// monthly budget must not start afresh (docs/migrating.md).
		s.svc.CarryIncumbent = true
	}
	for _, a := range args {
		if name, _, _ := strings.Cut(strings.TrimLeft(a, "-"), "="); name == "redis-url" && strings.HasPrefix(a, "-") {
			s.redisURLInArgs = true
		}
	}
	s.finish()
	if err := s.validate(); err != nil {
		// Flags or variables that cannot go together, or a value out
		// of its bounds: as given, the server cannot run.
		return nil, usagef("ratelimitd", "%w", err)
	}
	return s, nil
}

// isSet reports whether the flag name was set, by a variable or an
// argument.
func isSet(fs *flag.FlagSet, name string) bool {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}

// knownArgs splits args into ratelimitd's own flags (with their values)
// and the rest: envoyproxy/ratelimit reads no arguments at all, so a
// Deployment written for it may carry any (Envoy AI Gateway's passes
// --quotaRateLimitServiceAddr=...), and taking its place must not refuse
// them. An unknown flag without "=" takes the next argument as its value
// unless that is a flag; after "--" everything is the rest.
func knownArgs(fs *flag.FlagSet, args []string) (known, ignored []string) {
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			return known, append(ignored, args[i+1:]...)
		}
		name, _, hasVal := strings.Cut(strings.TrimLeft(a, "-"), "=")
		f := fs.Lookup(name)
		switch {
		case !strings.HasPrefix(a, "-") || a == "-":
			ignored = append(ignored, a)
		case f != nil || name == "h" || name == "help":
			known = append(known, a)
			if !hasVal && f != nil && !isBoolFlag(f) && i+1 < len(args) {
				known = append(known, args[i+1])
				i++
			}
		default:
			ignored = append(ignored, a)
			if !hasVal && i+1 < len(args) && !strings.HasPrefix(args[i+1], "-") {
				ignored = append(ignored, args[i+1])
				i++
			}
		}
	}
	return known, ignored
}

// isBoolFlag reports a flag that stands bare (--shadow-mode).
func isBoolFlag(f *flag.Flag) bool {
	b, ok := f.Value.(interface{ IsBoolFlag() bool })
	return ok && b.IsBoolFlag()
}

// applyEnvCompat sets the flags another limiter's variables stand for.
func (s *settings) applyEnvCompat(fs *flag.FlagSet, compat string, getenv func(string) string) error {
	switch compat {
	case "", "none":
		return nil
	case "envoyproxy":
	default:
		return usagef("ratelimitd", "--env-compat %q: want envoyproxy or none", compat)
	}
	res, err := incumbentenv.Envoyproxy(getenv)
	if err != nil {
		return usagef("ratelimitd", "--env-compat=envoyproxy: %w", err)
	}
	for _, a := range res.Flags {
		if err := fs.Set(a.Flag, a.Value); err != nil {
			// Named as the user wrote it: the variable, not our flag.
			if strings.Contains(a.From, " and ") {
				return usagef("ratelimitd", "--env-compat=envoyproxy: %s give --%s=%q: %w", a.From, a.Flag, redisstore.Redact(a.Value), err)
			}
			return usagef("ratelimitd", "--env-compat=envoyproxy: %s=%q: %w (read as --%s)", a.From, redisstore.Redact(a.Value), err, a.Flag)
		}
	}
	s.redisPassword, s.ignoredEnv, s.stats.opts.Mogrifiers = res.RedisPassword, res.Ignored, res.Mogrifiers
	return nil
}

// environ lists the process's variables (for unknownEnv).
var environ = os.Environ

// unknownEnv returns the RATELIMITD_ variables set (as getenv has them)
// that name no flag: a misspelling would otherwise pass unseen.
func unknownEnv(fs *flag.FlagSet, getenv func(string) string) []string {
	var out []string
	for _, kv := range environ() {
		name, _, _ := strings.Cut(kv, "=")
		flagName := strings.ToLower(strings.ReplaceAll(strings.TrimPrefix(name, envPrefix), "_", "-"))
		if strings.HasPrefix(name, envPrefix) && getenv(name) != "" && fs.Lookup(flagName) == nil {
			out = append(out, name)
		}
	}
	return out
}

// applyEnv sets each flag from its RATELIMITD_ variable.
func applyEnv(fs *flag.FlagSet, getenv func(string) string) error {
	var errs []error
	fs.VisitAll(func(f *flag.Flag) {
		name := envPrefix + strings.ToUpper(strings.ReplaceAll(f.Name, "-", "_"))
		if v := getenv(name); v != "" {
			if err := fs.Set(f.Name, v); err != nil {
				errs = append(errs, fmt.Errorf("%s=%q: %w", name, redisstore.Redact(v), err))
			}
		}
	})
	if len(errs) > 0 {
		return usagef("ratelimitd", "%w", errors.Join(errs...))
	}
	return nil
}

// finish copies what several flags say together into the options.
func (s *settings) finish() {
	s.svc.ResponseHeaders = service.HeaderStyle(s.responseHeaders)
	s.xds.opts.NodeMetadata, s.xds.opts.Headers = s.xds.nodeMeta, s.xds.headers
	s.xds.opts.MaxMessage = int(s.xds.maxMessage)
	s.stats.opts.Tags, s.stats.opts.NearLimitRatio = s.stats.tags, s.svc.NearLimitRatio
	s.stats.opts.Prometheus = s.stats.compatAddr != ""
	s.redis.URL = s.redisURL
	s.redis.CarryIncumbent = s.svc.CarryIncumbent
	s.redis.JournalBytes = int(s.journalSize)
	s.redis.ChargeJournal = s.journal == "on"
	s.redis.ChargeJournalAuto = s.journal == "" || s.journal == "auto"
	if s.globalPolicy == "share" {
		s.global.Policy = global.Share
	}
}

// flagOf names each component option a flag sets, for their errors.
var flagOf = map[string]string{
	"service.HeaderNames.Limit": "--response-header-limit", "service.HeaderNames.Remaining": "--response-header-remaining",
	"service.HeaderNames.Reset": "--response-header-reset", "service.NearLimitRatio": "--near-limit-ratio",
	"service.UsageTimeout": "--usage-timeout",
	"redisstore.Mode":      "--redis-mode", "redisstore.URL": "--redis-url", "redisstore.Timeout": "--redis-timeout", "redisstore.BreakerOpenAfter": "--breaker-open-after",
	"lease.Interval": "--lease-interval", "global.Refresh": "--global-refresh", "global.Share": "--global-partition-share",
	"redisstore.JournalBytes": "--charge-journal-size",
	"rlqs.MaxStreams":         "--rlqs-max-streams", "rlqs.MaxBuckets": "--rlqs-max-buckets", "rlqs.Margin": "--rlqs-margin",
	"rlqs.IdleAfter":   "--rlqs-idle-after",
	"tracing.Protocol": "--tracing-protocol", "tracing.SamplingRate": "--tracing-sampling-rate",
	"xds.MaxMessage": "--xds-max-message-size", "xds.BackoffInitial": "--xds-backoff-initial", "xds.BackoffMax": "--xds-backoff-max",
	"incumbentstats.StatsdProtocol": "--statsd-protocol", "incumbentstats.DogStatsd": "--dogstatsd",
	"incumbentstats.FlushInterval": "--stats-flush-interval", "incumbentstats.NearLimitRatio": "--near-limit-ratio",
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

// globalDomainList is --global-domains as a list.
func (s *settings) globalDomainList() []string {
	var out []string
	for _, d := range strings.Split(s.globalDomains, ",") {
		if d = strings.TrimSpace(d); d != "" {
			out = append(out, d)
		}
	}
	return out
}
