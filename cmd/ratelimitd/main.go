// Command ratelimitd is a global rate-limit service for Envoy's
// envoy.filters.http.ratelimit filter and any gRPC client. See README.md.
package main

import (
	"context"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := cli(ctx, os.Args[1:], envFor(os.Args[0], os.Getenv), os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// IncumbentName is the name envoyproxy/ratelimit's images run it by
// (/bin/ratelimit). Invoked under it, ratelimitd reads the incumbent's
// environment (--env-compat=envoyproxy) unless told otherwise, so that
// swapping the image is the whole migration.
const IncumbentName = "ratelimit"

// envFor is the environment as run reads it when the binary was started
// as argv0: under IncumbentName, RATELIMITD_ENV_COMPAT defaults to
// envoyproxy (an explicit value, "none" included, still wins).
func envFor(argv0 string, getenv func(string) string) func(string) string {
	if strings.TrimSuffix(filepath.Base(argv0), ".exe") != IncumbentName {
		return getenv
	}
	return func(k string) string {
		v := getenv(k)
		if k == envPrefix+"ENV_COMPAT" && v == "" {
			return "envoyproxy"
		}
		return v
	}
}
