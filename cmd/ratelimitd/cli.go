package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"runtime"
	"runtime/debug"
	"strings"
)

// usageError is a command line that cannot be run as given (an unknown
// flag, a value a flag refuses, an argument missing): it is said in one
// line with a hint to the command's help, and the exit status is 2, as
// Go's flag package and go, kubectl and promtool do.
type usageError struct {
	cmd string // "ratelimitd", "ratelimitd check-config", ...
	err error
}

func (e *usageError) Error() string { return e.err.Error() }
func (e *usageError) Unwrap() error { return e.err }

// exitError ends a command with its own exit status (diff's, as
// diff(1)'s), err printed when set.
type exitError struct {
	code   int
	err    error
	logged bool // err was logged already: print nothing more
}

func (e *exitError) Error() string {
	if e.err == nil {
		return fmt.Sprintf("exit status %d", e.code)
	}
	return e.err.Error()
}

func (e *exitError) Unwrap() error { return e.err }

// usagef is a usageError of cmd.
func usagef(cmd, format string, a ...any) error {
	return &usageError{cmd: cmd, err: fmt.Errorf(format, a...)}
}

// cli runs the command line and returns the exit status: 0, 1 when it
// failed, 2 when it could not be run as given. Results go to stdout;
// logs and errors to stderr.
func cli(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	err := run(ctx, args, getenv, stdout, stderr)
	var ue *usageError
	var ee *exitError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &ee):
		if ee.err != nil && !ee.logged {
			fmt.Fprintln(stderr, "ratelimitd:", ee.err)
		}
		return ee.code
	case errors.As(err, &ue):
		fmt.Fprintf(stderr, "%s: %v\nRun '%s -h' for usage.\n", ue.cmd, ue.err, ue.cmd)
		return 2
	default:
		fmt.Fprintln(stderr, "ratelimitd:", err)
		return 1
	}
}

// parseFlags parses args into fs, printing nothing of its own: help asked
// for (-h, --help) prints fs.Usage to out, a result, and returns
// flag.ErrHelp; any other error is a usageError of cmd.
func parseFlags(fs *flag.FlagSet, cmd string, args []string, out io.Writer) error {
	usage := fs.Usage
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	err := fs.Parse(args)
	fs.SetOutput(out)
	fs.Usage = usage
	switch {
	case errors.Is(err, flag.ErrHelp):
		fs.Usage()
		return flag.ErrHelp
	case err != nil:
		return &usageError{cmd: cmd, err: err}
	}
	return nil
}

// commands are the subcommands, for the usage.
var commands = []struct{ name, what string }{
	{"check-config", "check rules files as the server loads them; exit 1 on a problem"},
	{"explain", "print the rule each descriptor matches and what becomes of its limit"},
	{"diff", "print what a change of the rules does, rule by rule"},
	{"healthcheck", "ask a server's gRPC health service; exit 0 only on SERVING"},
	{"version", "print the version"},
}

// serverUsage is the usage of the server and its flags, to fs's output.
func serverUsage(fs *flag.FlagSet) func() {
	return func() {
		out := fs.Output()
		fmt.Fprint(out, "Usage:\n  ratelimitd [flags]          serve (docs/configuration.md)\n  ratelimitd COMMAND [args]   run a command\n\nCommands:\n")
		for _, c := range commands {
			fmt.Fprintf(out, "  %-13s %s\n", c.name, c.what)
		}
		fmt.Fprint(out, "Run 'ratelimitd COMMAND -h' for a command's flags; 'ratelimitd --version' prints the version.\n\n"+
			"Flags (each also read from RATELIMITD_<NAME>: --redis-url from RATELIMITD_REDIS_URL; a flag wins):\n")
		fs.PrintDefaults()
	}
}

// versionLine is what --version and the version command print: the
// version stamped at build (-ldflags -X main.version=...), else the
// module's or the commit's, and the Go version.
func versionLine() string {
	v := version
	if info, ok := debug.ReadBuildInfo(); ok && v == "dev" {
		for _, s := range info.Settings {
			if s.Key == "vcs.revision" && len(s.Value) >= 12 {
				v = "dev-" + s.Value[:12]
			}
		}
		if mv := info.Main.Version; mv != "" && mv != "(devel)" {
			v = mv
		}
	}
	return fmt.Sprintf("ratelimitd %s %s %s/%s", v, runtime.Version(), runtime.GOOS, runtime.GOARCH)
}

// wantsVersion reports --version (or -version) among the arguments before
// a "--".
func wantsVersion(args []string) bool {
	for _, a := range args {
		if a == "--" {
			return false
		}
		if strings.TrimLeft(a, "-") == "version" && strings.HasPrefix(a, "-") && len(a)-len("version") <= 2 {
			return true
		}
	}
	return false
}
