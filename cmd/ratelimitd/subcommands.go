package main

import (
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/ratelimitd/ratelimitd/config"
)

// checkConfig validates rules the way the server loads them, all the
// paths as one set (as the files of one --config directory are), so that
// `check-config rules/*.yaml` in a rules repository's CI catches what the
// server would refuse, a domain defined in two files among them: every
// problem of every file is printed to errOut, one a line, and the exit
// status is non-zero when there is any; the ok line goes to out. It stops
// when ctx is done (SIGINT, SIGTERM).
func checkConfig(ctx context.Context, args []string, out, errOut io.Writer) error {
	const cmd = "ratelimitd check-config"
	fs := flag.NewFlagSet(cmd, flag.ContinueOnError)
	merge := fs.Bool("merge-domains", false, "merge files that share a domain, as the server's --merge-domains")
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "Usage: ratelimitd check-config [--merge-domains] PATH...\n\nChecks rules files or directories as one set, as the server loads them:\nevery problem on stderr, one a line, exit 1; the ok line on stdout.\n\nFlags:")
		fs.PrintDefaults()
	}
	if err := parseFlags(fs, cmd, args, out); err != nil {
		return helpIsDone(err)
	}
	if fs.NArg() == 0 {
		return usagef(cmd, "no rules path given")
	}
	snap, err := config.LoadWith(ctx, config.Options{MergeDomains: *merge}, fs.Args()...)
	if ctx.Err() != nil {
		return errors.New("check-config: interrupted")
	}
	if err != nil {
		lines := strings.Split(err.Error(), "\n")
		for _, line := range lines {
			fmt.Fprintln(errOut, line)
		}
		return fmt.Errorf("check-config: %d problem(s) in %s", len(lines), strings.Join(fs.Args(), " "))
	}
	rules := 0
	for _, d := range snap.Domains() {
		rules += len(snap.Domain(d).Rules())
	}
	for _, w := range snap.Warnings() {
		fmt.Fprintln(errOut, w)
	}
	if g := snap.GlobalRules(); len(g) > 0 {
		fmt.Fprintf(errOut, "%s: note: %d limit(s) global (rate_limit.global): one limit across regions where the server runs with --global-redis-url; without it each region enforces its own\n", g[0], len(g))
	}
	fmt.Fprintf(out, "%s: ok: %d file(s), %d domain(s), %d rule(s), hash %s\n", strings.Join(fs.Args(), " "), len(snap.Files), len(snap.Domains()), rules, snap.Hash)
	return nil
}

// helpIsDone is nil for help asked for and printed (the command did what
// it was asked), else err.
func helpIsDone(err error) error {
	if errors.Is(err, flag.ErrHelp) {
		return nil
	}
	return err
}

// healthcheck asks a server's grpc.health.v1 service and succeeds only on
// SERVING, printed to out: the probe for images without a shell.
func healthcheck(ctx context.Context, args []string, out io.Writer) error {
	const cmd = "ratelimitd healthcheck"
	fs := flag.NewFlagSet(cmd, flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "Usage: ratelimitd healthcheck [flags]\n\nAsks a server's grpc.health.v1 service: SERVING on stdout and exit 0,\nelse the status or the error on stderr and exit 1.\n\nFlags:")
		fs.PrintDefaults()
	}
	addr := fs.String("addr", "127.0.0.1:8081", "gRPC address of the server")
	service := fs.String("service", "", "health service name (empty: the whole server)")
	timeout := fs.Duration("timeout", 2*time.Second, "give up after this long")
	ca := fs.String("tls-ca", "", "PEM CA of the server's certificate: connect with TLS")
	cert := fs.String("tls-cert", "", "PEM client certificate, for a server that requires one")
	key := fs.String("tls-key", "", "PEM key of --tls-cert")
	if err := parseFlags(fs, cmd, args, out); err != nil {
		return helpIsDone(err)
	}
	if fs.NArg() > 0 {
		return usagef(cmd, "unexpected argument %q", fs.Arg(0))
	}
	creds := insecure.NewCredentials()
	if *ca != "" {
		pool, err := loadPool("--tls-ca", *ca)
		if err != nil {
			return fmt.Errorf("healthcheck: %w", err)
		}
		conf := &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
		if *cert != "" {
			c, err := loadPair("--tls-cert", *cert, *key)
			if err != nil {
				return fmt.Errorf("healthcheck: %w", err)
			}
			conf.Certificates = []tls.Certificate{*c}
		}
		creds = credentials.NewTLS(conf)
	}
	cc, err := grpc.NewClient(*addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		return fmt.Errorf("healthcheck: %w", err)
	}
	defer cc.Close()
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	resp, err := healthpb.NewHealthClient(cc).Check(ctx, &healthpb.HealthCheckRequest{Service: *service})
	if err != nil {
		return fmt.Errorf("healthcheck %s: %w", *addr, err)
	}
	if resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		return fmt.Errorf("healthcheck %s: %s", *addr, resp.GetStatus())
	}
	fmt.Fprintln(out, "SERVING")
	return nil
}
