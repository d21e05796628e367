package main

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/encoding/protojson"
)

// readmeCall is one call the README shows, and the answer it shows.
type readmeCall struct {
	grpc       bool
	body, want string
}

var (
	curlLine    = regexp.MustCompile(`^curl -s -XPOST localhost:8080/json -d '(.*)'$`)
	grpcurlLine = regexp.MustCompile(`^grpcurl -plaintext -d '(.*)' \\$`)
	resetField  = regexp.MustCompile(`"durationUntilReset":\s*"\d+s"`)
)

// readmeCalls reads the README's curl and grpcurl calls, each followed by
// its answer as comment lines, and the llm rules its budget example
// starts the service on.
func readmeCalls(t *testing.T) (calls []readmeCall, llmRules string) {
	t.Helper()
	data, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(string(data), "\n")
	for i := 0; i < len(lines); i++ {
		if strings.HasPrefix(lines[i], "domain: llm") {
			for j := i; j < len(lines) && lines[j] != "```"; j++ {
				llmRules += lines[j] + "\n"
			}
		}
		c := readmeCall{}
		if m := curlLine.FindStringSubmatch(lines[i]); m != nil {
			c.body = m[1]
		} else if m := grpcurlLine.FindStringSubmatch(lines[i]); m != nil {
			c.body, c.grpc = m[1], true
			i++ // the address and method
		} else {
			continue
		}
		for i+1 < len(lines) && strings.HasPrefix(lines[i+1], "# ") {
			c.want += strings.TrimPrefix(lines[i+1], "# ") + "\n"
			i++
		}
		calls = append(calls, c)
	}
	return calls, llmRules
}

// sameJSON compares two JSON texts as values, each answer's reset (which
// depends on the time) left out.
func sameJSON(t *testing.T, got, want string) bool {
	t.Helper()
	var g, w any
	if err := json.Unmarshal([]byte(resetField.ReplaceAllString(got, `"durationUntilReset":"-"`)), &g); err != nil {
		t.Fatalf("the answer %q: %v", got, err)
	}
	if err := json.Unmarshal([]byte(resetField.ReplaceAllString(want, `"durationUntilReset":"-"`)), &w); err != nil {
		t.Fatalf("the README's answer %q: %v", want, err)
	}
	return reflect.DeepEqual(g, w)
}

// TestReadmeExamples: every call the README shows, made as it shows it
// against the service started as it says, gets the answer it shows (the
// time to the reset aside): a fresh clone that follows the README sees
// what the README says.
func TestReadmeExamples(t *testing.T) {
	calls, llmRules := readmeCalls(t)
	if len(calls) < 4 || llmRules == "" {
		t.Fatalf("%d calls and rules %q read from the README: the test reads nothing", len(calls), llmRules)
	}
	llm := filepath.Join(t.TempDir(), "llm.yaml")
	if err := os.WriteFile(llm, []byte(llmRules), 0o600); err != nil {
		t.Fatal(err)
	}
	// The calls of one address count on: none may straddle a minute's
	// end (the example's window), nor a day's (the budget's).
	if left := time.Until(time.Now().Truncate(time.Minute).Add(time.Minute)); left < 3*time.Second {
		time.Sleep(left + 100*time.Millisecond)
	}
	example := start(t, env(nil), "--config", "../../deploy/rules")
	budget := start(t, env(nil), "--config", llm)
	for _, c := range calls {
		in := example
		if strings.Contains(c.body, `"domain":"llm"`) {
			in = budget
		}
		var got string
		if c.grpc {
			req := &rlsv3.RateLimitRequest{}
			if err := protojson.Unmarshal([]byte(c.body), req); err != nil {
				t.Fatal(err)
			}
			resp, err := rlsv3.NewRateLimitServiceClient(dial(t, in.grpcAddr)).ShouldRateLimit(context.Background(), req)
			if err != nil {
				t.Fatal(err)
			}
			got = protojson.Format(resp)
		} else {
			resp, err := http.Post("http://"+in.httpAddr+"/json", "application/json", strings.NewReader(c.body))
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			got = string(b)
		}
		if !sameJSON(t, got, c.want) {
			t.Errorf("the README's call %s\nanswers %s\nwhere the README shows %s", c.body, got, c.want)
		}
	}
}
