// Package incumbentenv maps another rate limiter's environment variables onto
// ratelimitd's flags, so that its image can replace that limiter's with
// the Deployment unchanged: a pure function from the environment to flag
// assignments, which the command applies beneath its own variables and
// flags.
package incumbentenv

import (
	"fmt"
	"net"
	"net/url"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/ratelimitd/ratelimitd/internal/incumbentstats"
)

// Assignment is a flag and the value a variable gives it: From names
// the variable (or variables, "HOST and PORT") it came from, for errors.
type Assignment struct{ Flag, Value, From string }

// Result is what an environment maps to.
type Result struct {
	// Flags are the flag values the variables stand for, in order.
	Flags []Assignment
	// RedisPassword is REDIS_AUTH's password (its user goes in the URL).
	RedisPassword string
	// Ignored are the variables set that ratelimitd does without, each
	// with why.
	Ignored []string
	// Mogrifiers are the DogStatsD mogrifiers the variables define.
	Mogrifiers []incumbentstats.Mogrifier
}

// Setting is one of envoyproxy/ratelimit's environment variables and
// what becomes of it.
type Setting struct {
	Name string
	// Flag is the ratelimitd flag it sets ("" when it is read with
	// others, or ignored); Ignore says why ratelimitd does without it;
	// Refuse says why it cannot honour a value other than OK.
	Flag   string
	Ignore string
	Refuse string
	OK     []string // values that need no flag (Refuse applies to others)
}

// mapper reads one environment into a Result.
type mapper struct {
	getenv func(string) string
	res    Result
}

func (m *mapper) set(from, flag, v string) {
	m.res.Flags = append(m.res.Flags, Assignment{Flag: flag, Value: v, From: from})
}

func (m *mapper) ignore(name, why string) { m.res.Ignored = append(m.res.Ignored, name+": "+why) }

func (m *mapper) isTrue(name string) bool {
	b, _ := strconv.ParseBool(m.getenv(name))
	return b
}

// Envoyproxy maps envoyproxy/ratelimit's environment: the flag values it
// stands for, a Redis password (REDIS_AUTH), the variables set but
// ignored (with why), or an error naming a variable whose meaning
// ratelimitd cannot honour.
func Envoyproxy(getenv func(string) string) (Result, error) {
	m := &mapper{getenv: getenv}
	for _, step := range []func() error{
		func() error { return m.table(Settings) },
		m.stats,
		m.tracing,
		m.misc,
		m.listen,
		m.rules,
		m.redis,
		m.perSecond,
		m.mogrifiers,
	} {
		if err := step(); err != nil {
			return Result{}, err
		}
	}
	// REDIS_AUTH is "password" or "user:password"; the user is in the URL.
	m.res.RedisPassword = getenv("REDIS_AUTH")
	if _, pass, ok := strings.Cut(m.res.RedisPassword, ":"); ok {
		m.res.RedisPassword = pass
	}
	return m.res, nil
}

// table takes a table's variables: the flags they set, those ignored, or
// an error for a value that cannot be honoured.
func (m *mapper) table(table []Setting) error {
	for _, e := range table {
		v := m.getenv(e.Name)
		switch {
		case v == "":
		case e.Flag != "":
			m.set(e.Name, e.Flag, v)
		case e.Refuse != "" && !slices.ContainsFunc(e.OK, func(ok string) bool { return strings.EqualFold(ok, v) }):
			return fmt.Errorf("%s=%q: %s", e.Name, v, e.Refuse)
		case e.Ignore != "":
			m.ignore(e.Name, e.Ignore)
		}
	}
	return nil
}

// tracing: TRACING_ENABLED turns tracing on, towards the collector the
// standard OTEL_EXPORTER_OTLP_ENDPOINT names (default: OTLP's port of the
// protocol on this host, as the SDK's), over OTLP/HTTP unless
// TRACING_EXPORTER_PROTOCOL says grpc: the incumbent's settings default it
// to http.
func (m *mapper) tracing() error {
	if !m.isTrue("TRACING_ENABLED") {
		return nil
	}
	proto := m.getenv("TRACING_EXPORTER_PROTOCOL")
	if proto == "" {
		m.set("TRACING_ENABLED", "tracing-protocol", "http")
	}
	endpoint := m.getenv("OTEL_EXPORTER_OTLP_ENDPOINT")
	switch {
	case endpoint != "":
	case strings.EqualFold(proto, "grpc"):
		endpoint = "localhost:4317"
	default:
		endpoint = "localhost:4318"
	}
	m.set("OTEL_EXPORTER_OTLP_ENDPOINT", "tracing-endpoint", endpoint)
	return nil
}

// misc reads the variables that stand for one flag each but for a value's
// form.
func (m *mapper) misc() error {
	if v := m.getenv("LOG_LEVEL"); v != "" {
		m.set("LOG_LEVEL", "log-level", strings.ToLower(v))
	}
	if m.isTrue("LIMIT_RESPONSE_HEADERS_ENABLED") {
		m.set("LIMIT_RESPONSE_HEADERS_ENABLED", "response-headers", "legacy")
	}
	if !m.isTrue("GRPC_SERVER_USE_TLS") && m.getenv("GRPC_SERVER_TLS_CERT") != "" {
		return fmt.Errorf("GRPC_SERVER_TLS_CERT is set but GRPC_SERVER_USE_TLS is not true")
	}
	return nil
}

// listen reads the listen addresses: HOST:PORT, GRPC_HOST:GRPC_PORT and
// DEBUG_HOST:DEBUG_PORT.
func (m *mapper) listen() error {
	for _, l := range []struct{ host, port, flag string }{{"HOST", "PORT", "http-addr"}, {"GRPC_HOST", "GRPC_PORT", "grpc-addr"}, {"DEBUG_HOST", "DEBUG_PORT", "debug-addr"}} {
		h, p := m.getenv(l.host), m.getenv(l.port)
		if p == "" && h == "" {
			continue
		}
		if p == "" {
			return fmt.Errorf("%s is set without %s", l.host, l.port)
		}
		if n, err := strconv.Atoi(p); err != nil || n < 0 || n > 65535 {
			return fmt.Errorf("%s=%q: want a port number (0-65535)", l.port, p)
		}
		m.set(l.host+" and "+l.port, l.flag, net.JoinHostPort(h, p))
	}
	return nil
}

// rules reads where the rules come from: over xDS, or in
// ROOT/SUBDIRECTORY/APPDIRECTORY.
func (m *mapper) rules() error {
	if !strings.EqualFold(m.getenv("CONFIG_TYPE"), "GRPC_XDS_SOTW") {
		if m.getenv("FORCE_START_WITHOUT_INITIAL_CONFIG") != "" {
			m.ignore("FORCE_START_WITHOUT_INITIAL_CONFIG", "rules files are loaded before serving")
		}
		if sub := m.getenv("RUNTIME_SUBDIRECTORY"); sub != "" {
			root, app := m.getenv("RUNTIME_ROOT"), m.getenv("RUNTIME_APPDIRECTORY")
			if root == "" {
				root = "/srv/runtime_data/current"
			}
			if app == "" {
				app = "config"
			}
			m.set("RUNTIME_ROOT, RUNTIME_SUBDIRECTORY and RUNTIME_APPDIRECTORY", "config", filepath.Join(root, sub, app))
		}
		return nil
	}
	server := m.getenv("CONFIG_GRPC_XDS_SERVER_URL")
	if server == "" {
		server = "localhost:18000" // the incumbent's default
	}
	m.set("CONFIG_GRPC_XDS_SERVER_URL", "xds-server", server)
	if err := m.table(XDS); err != nil {
		return err
	}
	for _, v := range []string{"RUNTIME_ROOT", "RUNTIME_SUBDIRECTORY", "RUNTIME_APPDIRECTORY"} {
		if m.getenv(v) != "" {
			m.ignore(v, "CONFIG_TYPE=GRPC_XDS_SOTW: the rules come over xDS")
		}
	}
	return nil
}

// redis reads the main Redis: its URL and mode.
func (m *mapper) redis() error {
	u, mode, err := m.redisURL("REDIS_", false)
	if err == nil && u != "" {
		m.set("REDIS_URL", "redis-url", u)
		m.set("REDIS_TYPE", "redis-mode", mode)
	}
	return err
}

// perSecond reads the per-second Redis (REDIS_PERSECOND=true): the main
// one's mode, its password in its URL (--redis-password-file is the main
// Redis's).
func (m *mapper) perSecond() error {
	if !m.isTrue("REDIS_PERSECOND") {
		return nil
	}
	_, mode, _ := m.redisURL("REDIS_", false)
	pu, pmode, err := m.redisURL("REDIS_PERSECOND_", true)
	switch {
	case err != nil:
		return err
	case pu == "":
		return fmt.Errorf("REDIS_PERSECOND=true without REDIS_PERSECOND_URL")
	case pmode != mode:
		return fmt.Errorf("REDIS_PERSECOND_TYPE %s differs from REDIS_TYPE %s: the per-second Redis takes the main one's mode", pmode, mode)
	}
	m.set("REDIS_PERSECOND_URL", "redis-persecond-url", pu)
	return nil
}

// redisURL builds a Redis URL and mode from the variables starting with
// prefix ("REDIS_" or "REDIS_PERSECOND_"): TYPE, URL, SOCKET_TYPE, TLS and
// AUTH's user, and its password too when withPassword (the per-second
// Redis's; the main one's is kept off the URL, in RedisPassword). The
// credentials are the master's: behind Sentinel its query values, since
// go-redis takes a sentinel URL's user info for the sentinels.
func (m *mapper) redisURL(prefix string, withPassword bool) (string, string, error) {
	raw := m.getenv(prefix + "URL")
	if raw == "" {
		return "", "", nil
	}
	scheme := "redis"
	if m.isTrue(prefix + "TLS") {
		scheme = "rediss"
	}
	user, pass, ok := strings.Cut(m.getenv(prefix+"AUTH"), ":")
	if !ok {
		user, pass = "", user
	}
	if !withPassword {
		pass = ""
	}
	info := "" // user info: user[:password]@
	switch {
	case pass != "":
		info = url.UserPassword(user, pass).String() + "@"
	case user != "":
		info = url.User(user).String() + "@"
	}
	switch strings.ToLower(m.getenv(prefix + "TYPE")) {
	case "", "single":
		u, err := m.singleURL(prefix, raw, scheme, info, pass)
		return u, "single", err
	case "sentinel":
		parts := strings.Split(raw, ",")
		if len(parts) < 2 {
			return "", "", fmt.Errorf("%sURL %q: want <master name>,<sentinel host:port>,...", prefix, raw)
		}
		u := scheme + "://" + parts[1] + "?master_name=" + url.QueryEscape(parts[0]) + addrs(parts[2:], "&")
		if user != "" {
			u += "&username=" + url.QueryEscape(user)
		}
		if pass != "" {
			u += "&password=" + url.QueryEscape(pass)
		}
		return u, "sentinel", nil
	case "cluster":
		parts := strings.Split(raw, ",")
		return scheme + "://" + info + parts[0] + addrs(parts[1:], "?"), "cluster", nil
	}
	return "", "", fmt.Errorf("%sTYPE %q: want SINGLE, SENTINEL or CLUSTER", prefix, m.getenv(prefix+"TYPE"))
}

// singleURL is redisURL's for a single Redis: raw as given when a URL, a
// unix socket's (the incumbent's default socket type) or a host:port's.
func (m *mapper) singleURL(prefix, raw, scheme, info, pass string) (string, error) {
	if strings.Contains(raw, "://") {
		// A URL as given, its credentials added only where it has none
		// and a password is to go in.
		if pass != "" && !strings.Contains(raw, "@") {
			raw = strings.Replace(raw, "://", "://"+info, 1)
		}
		return raw, nil
	}
	st := strings.ToLower(m.getenv(prefix + "SOCKET_TYPE"))
	if st != "" && st != "unix" {
		return scheme + "://" + info + raw, nil
	}
	if _, port, err := net.SplitHostPort(raw); err == nil && st == "" && !strings.HasPrefix(raw, "/") {
		if _, err := strconv.Atoi(port); err == nil {
			return "", fmt.Errorf("%sURL=%q with %sSOCKET_TYPE unset names a unix socket (envoyproxy/ratelimit's default socket type); for a host:port set %sSOCKET_TYPE=tcp", prefix, raw, prefix, prefix)
		}
	}
	if pass == "" {
		info = ""
	}
	return "unix://" + info + raw, nil
}

// addrs is go-redis's addr= query parameters of hosts, the first after
// first ("?" or "&").
func addrs(hosts []string, first string) string {
	var b strings.Builder
	for i, a := range hosts {
		if i == 0 {
			b.WriteString(first)
		} else {
			b.WriteString("&")
		}
		b.WriteString("addr=" + a)
	}
	return b.String()
}

// stats reads the incumbent's stats sinks: statsd (on unless
// USE_STATSD=false, another sink is chosen, or DISABLE_STATS=true) and
// Prometheus (USE_PROMETHEUS=true). Unlike the incumbent, which refuses
// two sinks, both may be on.
func (m *mapper) stats() error {
	// DISABLE_STATS=true turns every sink off; the others are then not
	// read at all.
	flags := map[string]bool{}
	for _, name := range []string{"DISABLE_STATS", "USE_PROMETHEUS", "USE_DOG_STATSD", "USE_STATSD"} {
		if v := m.getenv(name); v != "" {
			b, err := strconv.ParseBool(v)
			if err != nil {
				return fmt.Errorf("%s=%q: want true or false", name, v)
			}
			flags[name] = b
		}
		if name == "DISABLE_STATS" && flags[name] {
			return nil
		}
	}
	prom, dog := flags["USE_PROMETHEUS"], flags["USE_DOG_STATSD"]
	statsd := !prom || dog
	if m.getenv("USE_STATSD") != "" {
		statsd = flags["USE_STATSD"]
	}
	if statsd || dog {
		m.statsd(dog)
	}
	if prom {
		addr := m.getenv("PROMETHEUS_ADDR")
		if addr == "" {
			addr = ":9090"
		}
		m.set("PROMETHEUS_ADDR", "compat-metrics-addr", addr)
		if path := m.getenv("PROMETHEUS_PATH"); path != "" {
			m.set("PROMETHEUS_PATH", "compat-metrics-path", path)
		}
		if f := m.getenv("PROMETHEUS_MAPPER_YAML"); f != "" {
			m.set("PROMETHEUS_MAPPER_YAML", "compat-metrics-mapper", f)
		}
	}
	return nil
}

// statsd reads the statsd sink's address and protocol (DogStatsD: UDP).
func (m *mapper) statsd(dog bool) {
	host, port := m.getenv("STATSD_HOST"), m.getenv("STATSD_PORT")
	if host == "" {
		host = "localhost"
	}
	if port == "" {
		port = "8125"
	}
	m.set("STATSD_HOST and STATSD_PORT", "statsd-addr", net.JoinHostPort(host, port))
	if p := m.getenv("STATSD_PROTOCOL"); p != "" && !dog {
		m.set("STATSD_PROTOCOL", "statsd-protocol", strings.ToLower(p))
	}
	if dog {
		m.set("USE_DOG_STATSD", "dogstatsd", "true")
		m.set("USE_DOG_STATSD", "statsd-protocol", "udp")
	}
}

// mogrifiers reads the incumbent's DogStatsD mogrifiers:
// USE_DOG_STATSD_MOGRIFIERS=A,B names them, and DOG_STATSD_MOGRIFIER_A_
// PATTERN (a regular expression), _NAME and _TAGS (k:v,k2:v2; $N in either
// stands for the pattern's groups) define each. They apply in the order
// named.
func (m *mapper) mogrifiers() error {
	names := m.getenv("USE_DOG_STATSD_MOGRIFIERS")
	if names == "" {
		return nil
	}
	for _, n := range strings.Split(names, ",") {
		n = strings.TrimSpace(n)
		prefix := "DOG_STATSD_MOGRIFIER_" + n + "_"
		pattern, name := m.getenv(prefix+"PATTERN"), m.getenv(prefix+"NAME")
		if pattern == "" || name == "" {
			return fmt.Errorf("mogrifier %s needs %sPATTERN and %sNAME", n, prefix, prefix)
		}
		re, err := regexp.Compile(pattern)
		if err != nil {
			return fmt.Errorf("%sPATTERN: %w", prefix, err)
		}
		tags, err := ParsePairs(m.getenv(prefix + "TAGS"))
		if err != nil {
			return fmt.Errorf("%sTAGS: %w", prefix, err)
		}
		m.res.Mogrifiers = append(m.res.Mogrifiers, incumbentstats.Mogrifier{Pattern: re, Name: name, Tags: tags})
	}
	return nil
}

// ParsePairs reads "k=v,k2=v2", or "k:v,..." as envoyproxy/ratelimit
// writes its maps: each pair splits at its first '=' or ':'.
func ParsePairs(s string) (map[string]string, error) {
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
