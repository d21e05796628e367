package config

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func TestRLQSKeys(t *testing.T) {
	snap, err := Load("testdata/rlqs.good.yaml")
	if err != nil {
		t.Fatal(err)
	}
	d := snap.Domain("edge")
	if !slices.Equal(d.RLQSKeys, []string{"tenant", "route"}) {
		t.Fatalf("RLQSKeys = %q", d.RLQSKeys)
	}
	for _, r := range d.Rules() {
		if !d.RLQSRule(r) {
			t.Errorf("%s: RLQSRule = false, want true", r.Path)
		}
	}
	if w := snap.Warnings(); len(w) != 0 {
		t.Errorf("Warnings = %q, want none (minute windows)", w)
	}
}

func TestRLQSBad(t *testing.T) {
	dir := t.TempDir()
	for _, tt := range []struct{ body, want string }{
		{"rlqs: {}\n", "rlqs.descriptor_keys: missing descriptor_keys"},
		{"rlqs: {descriptor_keys: []}\n", "rlqs.descriptor_keys: want a non-empty list of keys"},
		{"rlqs: {descriptor_keys: tenant}\n", "rlqs.descriptor_keys: want a non-empty list of keys, got str"},
		{"rlqs: {descriptor_keys: [\"\"]}\n", "rlqs.descriptor_keys[0]: empty key"},
		{"rlqs: {descriptor_keys: [a], keys: [b]}\n", `rlqs: unknown field "keys"`},
		{"rlqs: {descriptor_keys: [" + strings.Repeat("k,", 32) + "k]}\n", "33 keys, more than the 32 allowed"},
	} {
		path := filepath.Join(dir, "r.yaml")
		if err := os.WriteFile(path, []byte("domain: d\n"+tt.body), 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := Load(path); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%q: error %v, want %q", tt.body, err, tt.want)
		}
	}
}

// TestRLQSWarnings: only limits RLQS buckets reach, with windows under
// 10 s, are warned of; the file still loads.
func TestRLQSWarnings(t *testing.T) {
	path := filepath.Join(t.TempDir(), "r.yaml")
	body := `domain: d
rlqs: {descriptor_keys: [tenant, route]}
descriptors:
  - key: tenant
    rate_limit: {unit: second, requests_per_unit: 10}
    descriptors:
      - key: route
        rate_limit: {unit: second, requests_per_unit: 5, unit_multiplier: 10}
      - key: method
        rate_limit: {unit: second, requests_per_unit: 5}
  - key: route
    rate_limit: {unit: second, requests_per_unit: 5}
`
	if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	snap, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	w := snap.Warnings()
	if len(w) != 1 || !strings.Contains(w[0], "r.yaml:4: d.tenant: warning: RLQS buckets reach this 1s window") {
		t.Errorf("Warnings = %q, want one for d.tenant at line 4 (10s and unreached rules are fine)", w)
	}
}

func TestRLQSMerge(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("a.yaml", "domain: d\nrlqs: {descriptor_keys: [a]}\ndescriptors: [{key: a, rate_limit: {unit: minute, requests_per_unit: 1}}]\n")
	write("b.yaml", "domain: d\ndescriptors: [{key: b, rate_limit: {unit: minute, requests_per_unit: 1}}]\n")
	snap, err := LoadWith(t.Context(), Options{MergeDomains: true}, dir)
	if err != nil {
		t.Fatal(err)
	}
	if got := snap.Domain("d").RLQSKeys; !slices.Equal(got, []string{"a"}) {
		t.Errorf("merged RLQSKeys = %q, want [a]", got)
	}
	write("c.yaml", "domain: d\nrlqs: {descriptor_keys: [c]}\ndescriptors: [{key: c, rate_limit: {unit: minute, requests_per_unit: 1}}]\n")
	if _, err := LoadWith(t.Context(), Options{MergeDomains: true}, dir); err == nil || !strings.Contains(err.Error(), "rlqs.descriptor_keys: differs") {
		t.Errorf("conflicting keys: error %v, want a conflict", err)
	}
}
