package main

import (
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/config"
)

// TestFlagBounds: every bound on a flag's value is checked by
// parseSettings alone, no server started, and the error names the flag.
func TestFlagBounds(t *testing.T) {
	base := []string{"--config", "rules.yaml"}
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"--rlqs-max-streams", "0"}, "-rlqs-max-streams"},
		{[]string{"--rlqs-margin", "2m"}, "--rlqs-margin 2m0s: want more than 0, at most 1m"},
		{[]string{"--rlqs-idle-after", "1s"}, "--rlqs-idle-after 1s"},
		{[]string{"--redis-timeout", "0s"}, "-redis-timeout"},
		{[]string{"--redis-url", "redis://h:1", "--redis-mode", "ring"}, `--redis-mode "ring": want single, sentinel or cluster`},
		{[]string{"--lease-interval", "2m"}, "--lease-interval 2m0s: want at most 1m"},
		{[]string{"--charge-journal"}, "--charge-journal needs --redis-url"},
		{[]string{"--redis-url", "redis://h:1", "--charge-journal=off", "--charge-journal-size", "1MiB"}, "--charge-journal-size needs the charge journal"},
		{[]string{"--usage-timeout", "1500ms"}, "--usage-timeout 1.5s: want whole seconds from 1s to 24h"},
		{[]string{"--near-limit-ratio", "1.5"}, "-near-limit-ratio"},
		{[]string{"--response-header-limit", "bad header"}, `--response-header-limit "bad header": not an HTTP header name`},
		{[]string{"--tracing-protocol", "udp"}, `--tracing-protocol "udp": want grpc or http`},
		{[]string{"--tracing-sampling-rate", "2"}, "--tracing-sampling-rate 2: want from 0 to 1"},
		{[]string{"--statsd-protocol", "sctp"}, `--statsd-protocol "sctp": want tcp or udp`},
		{[]string{"--dogstatsd"}, "--dogstatsd needs a statsd address"},
		{[]string{"--stats-flush-interval", "-1s"}, "-stats-flush-interval"},
		{[]string{"--xds-max-message-size", "100"}, "--xds-max-message-size 100: want at least 1024"},
		{[]string{"--statsd-tags", "nokv"}, "-statsd-tags"},
		{[]string{"--log-format", "xml"}, "--log-format must be text or json"},
		{[]string{"--grpc-max-concurrent-streams", "0"}, "-grpc-max-concurrent-streams"},
		{[]string{"--rejected-hits", "none"}, `unknown rejected_hits "none"`},
		{[]string{"--rejected-hits", "Nothing"}, `unknown rejected_hits "Nothing"`},
		{[]string{"--global-domains", "ai-gateway-quota"}, "--global-domains needs --global-redis-url"},
		{[]string{"--global-domains", " , ", "--global-redis-url", "redis://h:1", "--redis-url", "redis://r:1"}, "--global-domains \" , \": no domain named"},
	} {
		_, err := parseSettings(append(base, tt.args...), func(string) string { return "" }, io.Discard)
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%v: %v, want an error containing %q", tt.args, err, tt.want)
		}
	}
	// xDS's backoffs go together, and their bounds hold over xDS too.
	_, err := parseSettings([]string{"--xds-server", "x:1", "--xds-backoff-initial", "1m", "--xds-backoff-max", "1s"}, func(string) string { return "" }, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "--xds-backoff-max 1s") {
		t.Errorf("backoff max under initial: %v", err)
	}
	s, err := parseSettings(append(base, "--rlqs-margin", "2s", "--statsd-tags", "a:1,b=2", "--near-limit-ratio", "0.5"), func(string) string { return "" }, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if s.rlqs.Margin != 2*time.Second || s.stats.opts.Tags["a"] != "1" || s.stats.opts.Tags["b"] != "2" || s.stats.opts.NearLimitRatio != 0.5 || s.svc.NearLimitRatio != 0.5 {
		t.Errorf("parsed once into the options: margin %v, tags %v, ratios %v %v", s.rlqs.Margin, s.stats.opts.Tags, s.stats.opts.NearLimitRatio, s.svc.NearLimitRatio)
	}
}

// TestEnumFlagAfterSpace: a flag that may stand bare takes its value
// after a space too (--response-headers draft11), and stays bare before
// another flag; a value that is not one of its own is an argument still.
func TestEnumFlagAfterSpace(t *testing.T) {
	none := func(string) string { return "" }
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"--response-headers", "draft11"}, "draft11"},
		{[]string{"-response-headers", "legacy"}, "legacy"},
		{[]string{"--response-headers", "OFF"}, "off"},
		{[]string{"--response-headers", "--shadow-mode"}, "legacy"},
		{[]string{"--response-headers=draft11"}, "draft11"},
		{[]string{"--shadow-mode", "--response-headers"}, "legacy"},
	} {
		s, err := parseSettings(append([]string{"--config", "rules.yaml"}, tt.args...), none, io.Discard)
		if err != nil {
			t.Errorf("%v: %v", tt.args, err)
			continue
		}
		if got := s.responseHeaders.String(); got != tt.want {
			t.Errorf("%v: %s, want %s", tt.args, got, tt.want)
		}
	}
	if _, err := parseSettings([]string{"--config", "rules.yaml", "--response-headers", "sideways"}, none, io.Discard); err == nil ||
		!strings.Contains(err.Error(), `unexpected argument "sideways" after --response-headers, which takes legacy, draft11, off, true, false: write --response-headers=VALUE`) {
		t.Errorf("a value not its own: %v, want it left an argument, the flag's values named", err)
	}
	// Every flag that may stand bare: true/false flags and
	// --charge-journal take their value after a space as after "=".
	for _, tt := range []struct {
		args []string
		got  func(*settings) string
		want string
	}{
		{[]string{"--charge-journal", "off"}, func(s *settings) string { return s.journal.String() }, "off"},
		{[]string{"--charge-journal", "auto"}, func(s *settings) string { return s.journal.String() }, "auto"},
		{[]string{"--watch", "false"}, func(s *settings) string { return fmt.Sprint(s.watch) }, "false"},
		{[]string{"--shadow-mode", "true"}, func(s *settings) string { return fmt.Sprint(s.svc.ShadowMode) }, "true"},
		{[]string{"--shadow-mode", "FALSE"}, func(s *settings) string { return fmt.Sprint(s.svc.ShadowMode) }, "false"},
	} {
		s, err := parseSettings(append([]string{"--config", "rules.yaml", "--redis-url", "redis://127.0.0.1:1"}, tt.args...), none, io.Discard)
		if err != nil {
			t.Errorf("%v: %v", tt.args, err)
			continue
		}
		if got := tt.got(s); got != tt.want {
			t.Errorf("%v: %s, want %s", tt.args, got, tt.want)
		}
	}
	if _, err := parseSettings([]string{"--config", "rules.yaml", "--watch", "maybe"}, none, io.Discard); err == nil ||
		!strings.Contains(err.Error(), `unexpected argument "maybe" after --watch, which takes true, false: write --watch=VALUE`) {
		t.Errorf("a bool flag followed by a word not a bool: %v", err)
	}
}

// TestDefaults: what a start with no flags chooses where the image swap
// depends on it (the incumbent's 30- and 365-day windows, usage charges
// recorded), and a bad value from the environment stops the start as one
// from a flag does.
func TestDefaults(t *testing.T) {
	s, err := parseSettings([]string{"--config", "rules.yaml"}, func(string) string { return "" }, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	// Unset is the service's default, usage.
	if s.svc.CalendarPeriods || s.svc.RejectedHits != config.RejectedUnset && s.svc.RejectedHits != config.RejectedUsage {
		t.Fatalf("defaults: calendar periods %v, rejected hits %v; want false, usage", s.svc.CalendarPeriods, s.svc.RejectedHits)
	}
	for _, v := range []string{"none", "Nothing", ""} {
		env := func(k string) string {
			if k == "RATELIMITD_REJECTED_HITS" {
				return v
			}
			return ""
		}
		_, err := parseSettings([]string{"--config", "rules.yaml"}, env, io.Discard)
		if v == "" {
			if err != nil {
				t.Errorf("RATELIMITD_REJECTED_HITS unset: %v", err)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), "rejected") {
			t.Errorf("RATELIMITD_REJECTED_HITS=%s: %v, want the start refused", v, err)
		}
	}
}

// TestChargeJournalDefault: the charge journal is auto unless set
// (redisstore turns it on for single and Sentinel Redis), and
// --charge-journal takes on, off and a bare flag.
func TestChargeJournalDefault(t *testing.T) {
	for _, tt := range []struct {
		args     []string
		on, auto bool
	}{
		{nil, false, true},
		{[]string{"--charge-journal"}, true, false},
		{[]string{"--charge-journal=off"}, false, false},
		{[]string{"--charge-journal=auto"}, false, true},
	} {
		args := append([]string{"--config", "rules.yaml", "--redis-url", "redis://h:1"}, tt.args...)
		s, err := parseSettings(args, func(string) string { return "" }, io.Discard)
		if err != nil {
			t.Fatalf("%v: %v", tt.args, err)
		}
		if s.redis.ChargeJournal != tt.on || s.redis.ChargeJournalAuto != tt.auto {
			t.Errorf("%v: on %v, auto %v; want %v, %v", tt.args, s.redis.ChargeJournal, s.redis.ChargeJournalAuto, tt.on, tt.auto)
		}
	}
}

// TestIncumbentArgsIgnored: under --env-compat=envoyproxy (the default
// when run as ratelimit), arguments that are not ratelimitd's — Envoy AI
// Gateway's --quotaRateLimitServiceAddr=..., an unknown flag and its
// value, a bare word — are set aside to be listed at startup, never
// fatal; ratelimitd's own flags keep working around them. Without it, an
// unknown argument still stops the start.
func TestIncumbentArgsIgnored(t *testing.T) {
	compat := func(k string) string {
		return map[string]string{"RATELIMITD_ENV_COMPAT": "envoyproxy", "RUNTIME_ROOT": "/srv", "RUNTIME_SUBDIRECTORY": "ratelimit"}[k]
	}
	// An unknown flag followed by one of ratelimitd's (--bare, then
	// --log-level) takes no value: the next flag stays ratelimitd's.
	args := []string{"--quotaRateLimitServiceAddr=envoy-ai-gateway-ratelimit.envoy-gateway-system", "--shadow-mode",
		"-unknown", "value", "--bare", "--log-level", "debug", "word", "--response-headers", "draft11", "--other"}
	s, err := parseSettings(args, compat, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"--quotaRateLimitServiceAddr=envoy-ai-gateway-ratelimit.envoy-gateway-system", "-unknown", "value", "--bare", "word", "--other"}
	if strings.Join(s.ignoredArgs, " ") != strings.Join(want, " ") {
		t.Errorf("ignored %q, want %q", s.ignoredArgs, want)
	}
	if !s.svc.ShadowMode || s.logLevel != slog.LevelDebug || s.responseHeaders.String() != "draft11" {
		t.Errorf("own flags around the ignored ones: shadow %v, log level %q, headers %s", s.svc.ShadowMode, s.logLevel, s.responseHeaders.String())
	}
	if _, err := parseSettings([]string{"--config", "rules.yaml", "--quotaRateLimitServiceAddr=x"}, func(string) string { return "" }, io.Discard); err == nil {
		t.Error("an unknown flag taken without --env-compat")
	}
}

// TestFlagTablesMatchFlags: every flag is in docs/configuration.md's
// table, and every flag a table there or in the README names (its first
// column) is one: the docs cannot lose a flag or keep one removed.
func TestFlagTablesMatchFlags(t *testing.T) {
	fs := newFlagSet(&settings{}, io.Discard)
	known := map[string]bool{}
	fs.VisitAll(func(f *flag.Flag) { known[f.Name] = true })
	flagRef := regexp.MustCompile("`--([a-z0-9-]+)")
	documented := func(path string) map[string]bool {
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		in := map[string]bool{}
		for _, line := range strings.Split(string(b), "\n") {
			cells := strings.Split(line, "|")
			if !strings.HasPrefix(line, "| `--") || len(cells) < 3 {
				continue
			}
			for _, m := range flagRef.FindAllStringSubmatch(cells[1], -1) {
				in[m[1]] = true
				if !known[m[1]] {
					t.Errorf("%s lists --%s, which is no flag", path, m[1])
				}
			}
		}
		return in
	}
	table := documented("../../docs/configuration.md")
	documented("../../README.md")
	for name := range known {
		if !table[name] {
			t.Errorf("docs/configuration.md's table lacks --%s", name)
		}
	}
}

// TestFlagTableDefaults: each default docs/configuration.md's table
// states as a value (a cell, or its part for the row's n-th flag, that
// starts with `value`) is the flag's own default, read as the flag reads
// it (4MiB is 4194304, 1m is 1m0s); and a flag whose default is not
// zero states it so. A default is written in the code once; the table
// cannot drift from it.
func TestFlagTableDefaults(t *testing.T) {
	fs := newFlagSet(&settings{}, io.Discard)
	b, err := os.ReadFile("../../docs/configuration.md")
	if err != nil {
		t.Fatal(err)
	}
	flagRef := regexp.MustCompile("`--([a-z0-9-]+)")
	value := regexp.MustCompile("^`([^`]*)`")
	zero := map[string]bool{"": true, "false": true, "0": true, "0s": true}
	stated := map[string]bool{}
	for _, line := range strings.Split(strings.ReplaceAll(string(b), `\|`, "/"), "\n") {
		cells := strings.Split(line, "|")
		if !strings.HasPrefix(line, "| `--") || len(cells) < 4 {
			continue
		}
		flags := flagRef.FindAllStringSubmatch(cells[1], -1)
		parts := strings.Split(strings.TrimSpace(cells[2]), ", ")
		for i, f := range flags {
			if i >= len(parts) {
				break
			}
			m := value.FindStringSubmatch(strings.TrimSpace(parts[i]))
			fl := fs.Lookup(f[1])
			if m == nil || fl == nil {
				continue
			}
			stated[f[1]] = true
			probe := newFlagSet(&settings{}, io.Discard)
			if err := probe.Set(f[1], m[1]); err != nil {
				t.Errorf("--%s: the table's default %q does not parse: %v", f[1], m[1], err)
				continue
			}
			if got := probe.Lookup(f[1]).Value.String(); got != fl.Value.String() {
				t.Errorf("--%s: the table says %q (%s), the flag's default is %s", f[1], m[1], got, fl.Value.String())
			}
		}
	}
	fs.VisitAll(func(f *flag.Flag) {
		if !zero[f.DefValue] && !stated[f.Name] {
			t.Errorf("--%s defaults to %s; docs/configuration.md's table does not state it as `%s`", f.Name, f.DefValue, f.DefValue)
		}
	})
}
