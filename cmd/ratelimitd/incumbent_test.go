package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/internal/redisstore/redistest"
)

// recordedDir holds envoyproxy/ratelimit's own output for the traffic of
// incumbentTraffic over testdata/incumbent/shapes.yaml, copied verbatim
// from what it emitted (see its README.md); differences.txt lists, with
// the reason, the lines where ratelimitd differs on purpose.
var recordedDir = filepath.Join("testdata", "incumbent")

// incumbentCall is one line of the recorded traffic: entries, sent n
// times, one descriptor a request (record.py's TRAFFIC, OVERRIDE, HITS).
type incumbentCall struct {
	label    string
	entries  [][2]string
	n        int
	hits     int
	override map[string]any
}

var incumbentTraffic = func() []incumbentCall {
	e := func(kv ...string) [][2]string {
		var out [][2]string
		for i := 0; i+1 < len(kv); i += 2 {
			out = append(out, [2]string{kv[i], kv[i+1]})
		}
		return out
	}
	calls := []incumbentCall{
		{entries: e("k", "1"), n: 5}, {entries: e("kv", "v"), n: 5}, {entries: e("kv", "other"), n: 2}, {entries: e("a", "1", "b", "2"), n: 5},
		{entries: e("x", "x1", "y", "any", "z", "z1"), n: 5}, {entries: e("w", "1", "w2", "2", "w3", "3", "w4", "4"), n: 5},
		{entries: e("path", "/api/users"), n: 4}, {entries: e("path", "/api/orders"), n: 2}, {entries: e("files", "f/a.pdf"), n: 2}, {entries: e("files", "f/b.csv"), n: 3},
		{entries: e("dm", "alice", "dm2", "x"), n: 4}, {entries: e("dm", "bob", "dm2", "y"), n: 1}, {entries: e("vm", "red", "vm2", "q"), n: 4},
		{entries: e("sh", "1"), n: 3}, {entries: e("un", "1"), n: 3}, {entries: e("ro", "1"), n: 2}, {entries: e("rep", "1"), n: 2},
		{entries: e("nomatch", "1"), n: 2}, {entries: e("cidr", "192.168.0.0/16", "ip", "192.168.0.10"), n: 4}, {entries: e("host", "api.example.com"), n: 4},
		{entries: e("odd", "a:b|c"), n: 4},
		{entries: e("masked_remote_address", "10.0.0.0/8", "remote_address", "10.1.2.3"), n: 4},
		{entries: e("masked_remote_address", "172.16.0.0/12"), n: 4}, {entries: e("ver", "v1.2.3"), n: 4}, {entries: e("gw", "edge-10.1.2.3.example"), n: 4},
	}
	for i := range calls {
		var parts []string
		for _, kv := range calls[i].entries {
			parts = append(parts, kv[0]+"="+kv[1])
		}
		calls[i].label = strings.Join(parts, " ")
	}
	return append(calls,
		incumbentCall{label: "override k=ov 2/min", entries: e("k", "ov"), n: 3, override: map[string]any{"requests_per_unit": 2, "unit": "MINUTE"}},
		incumbentCall{label: "kv=v hits_addend 2", entries: e("kv", "v"), n: 1, hits: 2})
}()

// jsonCode sends one call to /json as record.py does and returns the
// overall code it answers.
func jsonCode(t *testing.T, httpAddr string, c incumbentCall) string {
	t.Helper()
	d := map[string]any{}
	var ents []map[string]string
	for _, kv := range c.entries {
		ents = append(ents, map[string]string{"key": kv[0], "value": kv[1]})
	}
	d["entries"] = ents
	if c.override != nil {
		d["limit"] = c.override
	}
	req := map[string]any{"domain": "shapes", "descriptors": []any{d}}
	if c.hits > 0 {
		req["hitsAddend"] = c.hits
	}
	body, _ := json.Marshal(req)
	resp, err := http.Post("http://"+httpAddr+"/json", "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out struct {
		OverallCode string `json:"overallCode"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil || out.OverallCode == "" {
		return fmt.Sprintf("HTTP %d", resp.StatusCode)
	}
	return out.OverallCode
}

// readLines returns a recorded file's lines.
func readLines(t *testing.T, name string) []string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(recordedDir, name))
	if err != nil {
		t.Fatal(err)
	}
	return strings.Split(strings.TrimRight(string(b), "\n"), "\n")
}

// deliberate reads differences.txt: "file: recorded line" entries, each
// under a "# why" comment, that ratelimitd need not emit as recorded.
func deliberate(t *testing.T) map[string]bool {
	t.Helper()
	out := map[string]bool{}
	for _, l := range readLines(t, "differences.txt") {
		if l == "" || strings.HasPrefix(l, "#") {
			continue
		}
		out[l] = true
	}
	return out
}

// TestIncumbentRecorded runs this binary as `ratelimit` with the
// incumbent's environment over the recorded traffic and holds it to what
// envoyproxy/ratelimit emitted: the same codes, and every recorded statsd
// counter and Prometheus series with the same value (series of its own
// beside them are fine), but for the deliberate differences.
func TestIncumbentRecorded(t *testing.T) {
	srv := redistest.Start(t)
	shapes, err := os.ReadFile(filepath.Join(recordedDir, "shapes.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	root := incumbentRules(t, string(shapes))
	sd := startStatsd(t, "tcp")
	statsdHost, statsdPort, _ := net.SplitHostPort(sd.addr)
	promAddr := freeAddr(t)
	httpAddr := runAsIncumbent(t, map[string]string{
		"RUNTIME_ROOT": root, "RUNTIME_SUBDIRECTORY": "ratelimit", "RUNTIME_WATCH_ROOT": "false", "RUNTIME_IGNOREDOTFILES": "true",
		"REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": srv.Addr(), "LOG_LEVEL": "info", "STATS_FLUSH_INTERVAL": "100ms",
		"USE_STATSD": "true", "STATSD_HOST": statsdHost, "STATSD_PORT": statsdPort,
		"USE_PROMETHEUS": "true", "PROMETHEUS_ADDR": promAddr,
	}).httpAddr
	// The rules count per minute and per hour: the traffic must not
	// straddle a minute.
	redistest.AwayFromWindowEnd(time.Minute, 15*time.Second)
	var codes []string
	for _, c := range incumbentTraffic {
		got := make([]string, c.n)
		for i := range got {
			got[i] = jsonCode(t, httpAddr, c)
		}
		codes = append(codes, c.label+": "+strings.Join(got, " "))
	}
	skip := deliberate(t)
	if want := readLines(t, "codes.txt"); !slices.Equal(codes, want) {
		t.Errorf("codes differ from the incumbent's:\n got %q\nwant %q", codes, want)
	}
	missing := func(file string, want []string, have func() map[string]bool) []string {
		var out []string
		h := have()
		for _, l := range want {
			if !h[l] && !skip[file+": "+l] {
				out = append(out, l)
			}
		}
		return out
	}
	statsd := func() map[string]bool {
		sd.mu.Lock()
		defer sd.mu.Unlock()
		out := map[string]bool{}
		for name, v := range sd.sums {
			if strings.HasPrefix(name, "ratelimit.service.") && sd.kind[name] == "c" {
				out[fmt.Sprintf("%s:%d", name, int64(v))] = true
			}
		}
		return out
	}
	prom := func() map[string]bool {
		out := map[string]bool{}
		for _, l := range strings.Split(get(t, "http://"+promAddr+"/metrics"), "\n") {
			if strings.HasPrefix(l, "ratelimit_service_") && !strings.Contains(l, "_bucket{") {
				out[l] = true
			}
		}
		return out
	}
	wantStatsd, wantProm := readLines(t, "statsd.txt"), readLines(t, "prometheus.txt")
	// Counters arrive as deltas over several flushes: wait until every
	// recorded line is there (or report what is not).
	eventuallyWithin(t, 20*time.Second, "the incumbent's recorded stats", func() error {
		ms, mp := missing("statsd.txt", wantStatsd, statsd), missing("prometheus.txt", wantProm, prom)
		if len(ms)+len(mp) > 0 {
			return fmt.Errorf("statsd lacks %d recorded lines:\n%s\nPrometheus lacks %d recorded series:\n%s",
				len(ms), strings.Join(ms, "\n"), len(mp), strings.Join(mp, "\n"))
		}
		return nil
	})
	// A deliberate difference that no longer differs must leave the list.
	s, p := statsd(), prom()
	for entry := range skip {
		file, line, _ := strings.Cut(entry, ": ")
		if file == "statsd.txt" && s[line] || file == "prometheus.txt" && p[line] {
			t.Errorf("differences.txt lists %q, which ratelimitd now emits as recorded: drop it", entry)
		}
	}
}

// TestRecordedCopies: the recorded files here are the ones recorded,
// byte for byte, where the shared recording is at hand (a developer's
// checkout; CI has only the copies).
func TestRecordedCopies(t *testing.T) {
	shared := filepath.Join("..", "..", "..", "shared", "incumbent-stats")
	if _, err := os.Stat(shared); err != nil {
		t.Skipf("no shared recording at %s", shared)
	}
	for _, f := range []string{"shapes.yaml", "codes.txt", "statsd.txt", "prometheus.txt",
		"dynamic-metadata/README.md", "dynamic-metadata/meta.yaml", "dynamic-metadata/calls.txt", "dynamic-metadata/recording.txt"} {
		a, err1 := os.ReadFile(filepath.Join(shared, f))
		b, err2 := os.ReadFile(filepath.Join(recordedDir, f))
		if err1 != nil || err2 != nil || !bytes.Equal(a, b) {
			t.Errorf("%s: the copy differs from the recording (%v, %v)", f, err1, err2)
		}
	}
}
