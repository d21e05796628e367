package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
)

// cliRun runs the command line as main does and returns its exit status,
// stdout and stderr.
func cliRun(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var out, errOut bytes.Buffer
	code := cli(context.Background(), args, env(nil), &out, &errOut)
	return code, out.String(), errOut.String()
}

// TestCommandLineHelp: -h and --help print the usage to stdout and exit
// 0; it lists every command and every flag's default once.
func TestCommandLineHelp(t *testing.T) {
	for _, h := range []string{"-h", "--help"} {
		code, out, errOut := cliRun(t, h)
		if code != 0 || errOut != "" {
			t.Errorf("%s: exit %d, stderr %q; want 0 and nothing", h, code, errOut)
		}
		for _, want := range []string{"check-config", "explain", "diff", "healthcheck", "version", "-redis-url", "RATELIMITD_REDIS_URL", "/metrics"} {
			if !strings.Contains(out, want) {
				t.Errorf("%s: the usage does not name %s:\n%s", h, want, out)
			}
		}
		for _, line := range strings.Split(out, "\n") {
			if strings.Count(line, "(default") > 1 {
				t.Errorf("%s: a default printed twice: %s", h, line)
			}
		}
	}
}

// TestCommandLineErrors: a flag the command does not know, or a value a
// flag refuses, is one line and a hint on stderr, exit 2, nothing on
// stdout (not the whole usage); so is a command missing its arguments.
func TestCommandLineErrors(t *testing.T) {
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"--frobnicate"}, "ratelimitd: flag provided but not defined: -frobnicate\nRun 'ratelimitd -h' for usage.\n"},
		{[]string{"--failure-mode", "maybe"}, "ratelimitd: invalid value \"maybe\" for flag -failure-mode: "},
		{[]string{"--config", "x.yaml", "extra"}, "ratelimitd: unexpected argument \"extra\""},
		{[]string{"check-config"}, "ratelimitd check-config: no rules path given\nRun 'ratelimitd check-config -h' for usage.\n"},
		{[]string{"check-config", "--nope", "x"}, "ratelimitd check-config: flag provided but not defined: -nope\n"},
		{[]string{"explain", "web"}, "ratelimitd explain: --config, a domain and at least one descriptor are needed\n"},
		{[]string{"diff", "a"}, "ratelimitd diff: want two rules paths"},
		{[]string{"healthcheck", "--timeout", "soon"}, "ratelimitd healthcheck: invalid value \"soon\" for flag -timeout"},
	} {
		code, out, errOut := cliRun(t, tt.args...)
		if code != 2 || out != "" || !strings.HasPrefix(errOut, tt.want) || strings.Count(errOut, "\n") != 2 {
			t.Errorf("%q: exit %d, stdout %q, stderr %q; want 2, nothing, and two lines starting %q", tt.args, code, out, errOut, tt.want)
		}
	}
}

// TestCommandLineResults: results go to stdout, so $(ratelimitd ...)
// captures them; help of a command exits 0; the version prints.
func TestCommandLineResults(t *testing.T) {
	for _, args := range [][]string{{"--version"}, {"version"}, {"--config", "x.yaml", "-version"}} {
		code, out, errOut := cliRun(t, args...)
		if code != 0 || !strings.HasPrefix(out, "ratelimitd ") || strings.Count(out, "\n") != 1 || errOut != "" {
			t.Errorf("%q: exit %d, stdout %q, stderr %q; want 0 and one line naming the version", args, code, out, errOut)
		}
	}
	for _, cmd := range []string{"check-config", "explain", "diff", "healthcheck"} {
		for _, h := range []string{"-h", "--help"} {
			code, out, errOut := cliRun(t, cmd, h)
			if code != 0 || !strings.HasPrefix(out, "Usage: ratelimitd "+cmd) || errOut != "" {
				t.Errorf("%s %s: exit %d, stdout %q, stderr %q; want 0 and the usage on stdout", cmd, h, code, out, errOut)
			}
		}
	}
	code, out, errOut := cliRun(t, "check-config", "../../deploy/rules")
	if code != 0 || !strings.Contains(out, "ok: ") || errOut != "" {
		t.Errorf("check-config of good rules: exit %d, stdout %q, stderr %q; want 0 and the ok line on stdout", code, out, errOut)
	}
	code, out, errOut = cliRun(t, "check-config", "../../config/testdata/bad_yaml.bad.yaml")
	if code != 1 || out != "" || !strings.Contains(errOut, "bad_yaml.bad.yaml:1: invalid YAML") {
		t.Errorf("check-config of bad rules: exit %d, stdout %q, stderr %q; want 1, nothing, the problem on stderr", code, out, errOut)
	}
	code, out, errOut = cliRun(t, "explain", "--config", "../../deploy/rules", "nodomain", "a=b")
	if code != 0 || !strings.Contains(out, "descriptors[0]") || errOut != "" {
		t.Errorf("explain: exit %d, stdout %q, stderr %q; want 0 and the explanation on stdout", code, out, errOut)
	}
}
