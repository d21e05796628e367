package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/internal/incumbentenv"
)

// TestBadInputMessages: a bad value, from a flag, ratelimitd's own
// variable or envoyproxy/ratelimit's, is a usage error (exit 2, nothing
// on stdout) whose message names what the user typed (the flag or the
// variable), the value, and what is accepted.
func TestBadInputMessages(t *testing.T) {
	incumbent := map[string]string{"RUNTIME_ROOT": t.TempDir(), "RUNTIME_SUBDIRECTORY": "rules"}
	for _, tt := range []struct {
		name string
		args []string
		env  map[string]string // with the incumbent's rules variables when compat
		want []string
	}{
		{"bool flag, spaced word", []string{"--config", "r.yaml", "--watch", "maybe"}, nil,
			[]string{`"maybe"`, "--watch", "true, false", "--watch=VALUE"}},
		{"journal flag, spaced word", []string{"--config", "r.yaml", "--charge-journal", "sometimes"}, nil,
			[]string{`"sometimes"`, "--charge-journal", "auto, on, off"}},
		{"bool flag", []string{"--config", "r.yaml", "--shadow-mode=perhaps"}, nil, []string{`"perhaps"`, "shadow-mode", "want true or false"}},
		{"log level flag", []string{"--config", "r.yaml", "--log-level", "verbose"}, nil, []string{`"verbose"`, "log-level", "want debug, info, warn or error"}},
		{"own variable, bool", []string{"--config", "r.yaml"}, map[string]string{"RATELIMITD_WATCH": "maybe"}, []string{`RATELIMITD_WATCH="maybe"`, "want true or false"}},
		{"own variable, level", []string{"--config", "r.yaml"}, map[string]string{"RATELIMITD_LOG_LEVEL": "verbose"}, []string{`RATELIMITD_LOG_LEVEL="verbose"`, "want debug, info, warn or error"}},
		{"own variable, size", []string{"--config", "r.yaml"}, map[string]string{"RATELIMITD_LOCAL_CACHE_SIZE": "lots"}, []string{`RATELIMITD_LOCAL_CACHE_SIZE="lots"`, "want a byte count"}},
		{"incumbent size", nil, map[string]string{"LOCAL_CACHE_SIZE_IN_BYTES": "abc"}, []string{`LOCAL_CACHE_SIZE_IN_BYTES="abc"`, "want a byte count"}},
		{"incumbent ratio", nil, map[string]string{"NEAR_LIMIT_RATIO": "2"}, []string{`NEAR_LIMIT_RATIO="2"`, "want a share in (0, 1]"}},
		{"incumbent timeout", nil, map[string]string{"REDIS_TIMEOUT": "soon"}, []string{`REDIS_TIMEOUT="soon"`, "want a positive duration"}},
		{"incumbent level", nil, map[string]string{"LOG_LEVEL": "verbose"}, []string{`LOG_LEVEL="verbose"`, "want debug, info, warn or error"}},
		{"incumbent bool", nil, map[string]string{"SHADOW_MODE": "perhaps"}, []string{`SHADOW_MODE="perhaps"`, "want true or false"}},
		{"incumbent port", nil, map[string]string{"PORT": "notaport"}, []string{`PORT="notaport"`, "want a port number"}},
		{"redis URL without a scheme", []string{"--config", "r.yaml", "--redis-url", "127.0.0.1:6379"}, nil, []string{"--redis-url", "127.0.0.1:6379", "want redis://", "rediss://", "master_name=", "addr="}},
		{"redis URL, scheme mistyped", []string{"--config", "r.yaml", "--redis-url", "redis//host"}, nil, []string{"--redis-url", "invalid URL scheme", "want redis://"}},
		{"redis URL's password kept out", []string{"--config", "r.yaml", "--redis-url", "redis://u:sekret@h:1/x"}, nil, []string{"--redis-url", "invalid database number"}},
		{"no rules", []string{}, nil, []string{"--config is required"}},
		{"incumbent redis host:port on unix", nil, map[string]string{"REDIS_URL": "127.0.0.1:6379"}, []string{`REDIS_URL="127.0.0.1:6379"`, "REDIS_SOCKET_TYPE=tcp"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			args, env := tt.args, map[string]string{}
			if tt.args == nil {
				args = []string{"--env-compat", "envoyproxy"}
				for k, v := range incumbent {
					env[k] = v
				}
			}
			for k, v := range tt.env {
				env[k] = v
			}
			var out, errOut bytes.Buffer
			code := cli(context.Background(), args, func(k string) string { return env[k] }, &out, &errOut)
			if code != 2 || out.Len() != 0 {
				t.Errorf("exit %d, stdout %q; want 2 and nothing (stderr %q)", code, out.String(), errOut.String())
			}
			if strings.Contains(errOut.String(), "sekret") {
				t.Errorf("stderr %q shows the password", errOut.String())
			}
			for _, w := range tt.want {
				if !strings.Contains(errOut.String(), w) {
					t.Errorf("stderr %q does not name %q", errOut.String(), w)
				}
			}
		})
	}
}

// TestLogEndsWithStopped: under --log-format json every line the process
// writes is JSON, a fatal start's error too; a server stopped says
// "stopped" last, after its stores have closed.
func TestLogEndsWithStopped(t *testing.T) {
	rules := writeRules(t, "domain: d\ndescriptors: []\n")
	jsonLines := func(t *testing.T, out string) []map[string]any {
		t.Helper()
		var lines []map[string]any
		for l := range strings.Lines(out) {
			var m map[string]any
			if err := json.Unmarshal([]byte(l), &m); err != nil {
				t.Errorf("not a JSON line: %q", l)
				continue
			}
			lines = append(lines, m)
		}
		return lines
	}
	t.Run("fatal start", func(t *testing.T) {
		var out, errOut syncBuffer
		code := cli(context.Background(), []string{"--config", rules, "--log-format", "json", "--grpc-addr", "256.0.0.1:1"}, env(nil), &out, &errOut)
		lines := jsonLines(t, errOut.String())
		if code != 1 || len(lines) == 0 || lines[len(lines)-1]["level"] != "ERROR" || !strings.Contains(fmt.Sprint(lines[len(lines)-1]["err"]), "--grpc-addr") {
			t.Errorf("exit %d, log %q; want 1 and a last JSON line naming --grpc-addr", code, errOut.String())
		}
	})
	t.Run("stopped", func(t *testing.T) {
		var out, errOut syncBuffer
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan int)
		go func() {
			done <- cli(ctx, []string{"--config", rules, "--log-format", "json", "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0"}, env(nil), &out, &errOut)
		}()
		deadline := time.Now().Add(20 * time.Second)
		for !strings.Contains(errOut.String(), `"msg":"serving"`) {
			if time.Now().After(deadline) {
				t.Fatalf("not serving after 20s: %s", errOut.String())
			}
			time.Sleep(10 * time.Millisecond)
		}
		cancel()
		if code := <-done; code != 0 {
			t.Errorf("exit %d after its context ended", code)
		}
		lines := jsonLines(t, errOut.String())
		if len(lines) == 0 || lines[len(lines)-1]["msg"] != "stopped" {
			t.Errorf("the last line is not \"stopped\":\n%s", errOut.String())
		}
	})
}

// TestEveryValueFlagSaysWhatItTakes: every flag that takes a value other
// than free text, given a value it cannot take, from the command line,
// from its RATELIMITD_ variable, or from the envoyproxy/ratelimit
// variable that sets it, is a usage error naming the flag or the
// variable, and saying what it takes.
func TestEveryValueFlagSaysWhatItTakes(t *testing.T) {
	var probe settings
	fs := newFlagSet(&probe, io.Discard)
	byFlag := map[string]string{}
	for _, st := range incumbentenv.Settings {
		if st.Flag != "" {
			byFlag[st.Flag] = st.Name
		}
	}
	n := 0
	fs.VisitAll(func(f *flag.Flag) {
		if fmt.Sprintf("%T", f.Value) == "*flag.stringValue" {
			return // free text: checked where it is used
		}
		n++
		const bad = "¿bad"
		run := func(how string, args []string, envs map[string]string, names ...string) {
			var out, errOut bytes.Buffer
			code := cli(context.Background(), args, func(k string) string { return envs[k] }, &out, &errOut)
			msg := errOut.String()
			if code != 2 || out.Len() != 0 || !strings.Contains(msg, bad) || !strings.Contains(msg, "want") {
				t.Errorf("--%s, %s: exit %d, stderr %q; want 2, the value and what it takes", f.Name, how, code, msg)
			}
			for _, name := range names {
				if !strings.Contains(msg, name) {
					t.Errorf("--%s, %s: stderr %q does not name %s", f.Name, how, msg, name)
				}
			}
		}
		run("flag", []string{"--config", "r.yaml", "--" + f.Name + "=" + bad}, nil, f.Name)
		env := envPrefix + strings.ToUpper(strings.ReplaceAll(f.Name, "-", "_"))
		run("variable", []string{"--config", "r.yaml"}, map[string]string{env: bad}, env)
		if v, ok := byFlag[f.Name]; ok {
			run("incumbent variable", []string{"--env-compat", "envoyproxy"},
				map[string]string{v: bad, "RUNTIME_ROOT": t.TempDir(), "RUNTIME_SUBDIRECTORY": "rules"}, v)
		}
	})
	if n < 20 {
		t.Errorf("only %d flags with a value type found", n)
	}
	t.Logf("%d flags with a value type, each from a flag, its variable and the incumbent's", n)
}

// TestUnknownVariableSaid: a RATELIMITD_ variable that names no flag (a
// misspelling) is said at start, not silently ignored.
func TestUnknownVariableSaid(t *testing.T) {
	vars := map[string]string{"RATELIMITD_WACH": "false", "RATELIMITD_WATCH": "false", "OTHER": "1"}
	was := environ
	environ = func() []string {
		return []string{"RATELIMITD_WACH=false", "RATELIMITD_WATCH=false", "OTHER=1", "RATELIMITD_EMPTY="}
	}
	defer func() { environ = was }()
	s, err := parseSettings([]string{"--config", "r.yaml"}, func(k string) string { return vars[k] }, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(s.unknownEnv, ",") != "RATELIMITD_WACH" {
		t.Errorf("unknown variables %v, want [RATELIMITD_WACH]", s.unknownEnv)
	}
}
