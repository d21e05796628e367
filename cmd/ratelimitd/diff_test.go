package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestDiff: a rules change read as its effect: limits lowered, rules
// added and removed, modes changed, and the changes that make counters
// start afresh (window, algorithm, share_threshold).
func TestDiff(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	old := write("old.yaml", `domain: web
descriptors:
  - key: ip
    rate_limit: {unit: minute, requests_per_unit: 100}
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 10}
  - key: gone
    rate_limit: {unit: hour, requests_per_unit: 1}
  - key: path
    value: /a*
    rate_limit: {unit: second, requests_per_unit: 5}
  - key: same
    rate_limit: {unit: second, requests_per_unit: 5}
  - key: budget
    rate_limit: {unit: month, requests_per_unit: 1000}
`)
	changed := write("new.yaml", `domain: web
descriptors:
  - key: ip
    rate_limit: {unit: minute, requests_per_unit: 50}
  - key: user
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 10, algorithm: sliding_window}
  - key: new
    rate_limit: {unit: day, requests_per_unit: 5}
  - key: path
    value: /a*
    share_threshold: true
    rate_limit: {unit: second, requests_per_unit: 5}
  - key: same
    rate_limit: {unit: second, requests_per_unit: 5}
  - key: budget
    rate_limit: {unit: month, requests_per_unit: 1000, rejected_hits: nothing, calendar: true}
`)
	// As diff(1): 1 when the rules differ, 0 when they do not, 2 when
	// they cannot be read.
	var out, errOut bytes.Buffer
	if code := cli(context.Background(), []string{"diff", old, changed}, env(nil), &out, &errOut); code != 1 || errOut.Len() != 0 {
		t.Fatalf("rules that differ: exit %d, stderr %q; want 1 and nothing\n%s", code, errOut.String(), out.String())
	}
	for _, want := range []string{
		"~ web.ip (" + changed + ":3): requests_per_unit 100 -> 50 (lowered)",
		"~ web.user (" + changed + ":5): unit hour -> minute; algorithm fixed_window -> sliding_window; its counters start afresh",
		"shadow_mode false -> true",
		"+ web.new (" + changed + ":8): 5 per day, fixed_window",
		"~ web.path_/a* (" + changed + ":10): share_threshold false -> true: its counters start afresh",
		"- web.gone (was " + old + ":7): 1 per hour, fixed_window; removed",
		"rejected_hits unset -> nothing; calendar false -> true; its counters start afresh",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("diff lacks %q:\n%s", want, out.String())
		}
	}
	if strings.Contains(out.String(), "web.same") {
		t.Errorf("an unchanged rule is listed:\n%s", out.String())
	}
	var none bytes.Buffer
	if code := cli(context.Background(), []string{"diff", old, old}, env(nil), &none, &none); code != 0 || !strings.Contains(none.String(), "no change in what is limited") {
		t.Errorf("no change: exit %d %q, want 0", code, none.String())
	}
	var missing bytes.Buffer
	if code := cli(context.Background(), []string{"diff", old, filepath.Join(dir, "missing.yaml")}, env(nil), &missing, &missing); code != 2 {
		t.Errorf("new rules missing: exit %d, want 2 (%s)", code, missing.String())
	}
	var bad syncBuffer
	if err := run(context.Background(), []string{"diff", old, filepath.Join(dir, "missing.yaml")}, env(nil), &bad, &bad); err == nil || !strings.Contains(err.Error(), "diff: new rules") {
		t.Errorf("missing new rules: %v", err)
	}
}
