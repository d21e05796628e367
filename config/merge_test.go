package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
)

// TestMergeDomains: files sharing a domain are refused unless merged;
// merged, every file's descriptors match as in one file (exact, then
// wildcards in load order, then key-only), and a descriptor two files
// define is an error naming both.
func TestMergeDomains(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("a.yaml", `domain: web
descriptors:
  - key: ip
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: path
    value: /a*
    rate_limit: {unit: minute, requests_per_unit: 2}
`)
	write("b.yaml", `domain: web
descriptors:
  - key: path
    value: /ab*
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: path
    value: /exact
    rate_limit: {unit: minute, requests_per_unit: 4}
  - key: path
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: user
    descriptors:
      - key: tier
        rate_limit: {unit: minute, requests_per_unit: 6}
`)
	if _, err := Load(dir); err == nil || !strings.Contains(err.Error(), `duplicate domain "web"`) || !strings.Contains(err.Error(), "--merge-domains") {
		t.Fatalf("unmerged: %v", err)
	}
	snap, err := LoadWith(t.Context(), Options{MergeDomains: true}, dir)
	if err != nil {
		t.Fatal(err)
	}
	d := snap.Domain("web")
	for _, tt := range []struct {
		give []string
		want uint64
	}{
		{[]string{"ip", "1"}, 1},
		{[]string{"path", "/abc"}, 2}, // a.yaml's wildcard loads first
		{[]string{"path", "/exact"}, 4},
		{[]string{"path", "/zzz"}, 5},
		{[]string{"user", "u", "tier", "gold"}, 6},
	} {
		var ents []*rlcommon.RateLimitDescriptor_Entry
		for i := 0; i+1 < len(tt.give); i += 2 {
			ents = append(ents, &rlcommon.RateLimitDescriptor_Entry{Key: tt.give[i], Value: tt.give[i+1]})
		}
		r := d.Match(ents)
		if r == nil || r.Limit == nil || r.Limit.RequestsPerUnit != tt.want {
			t.Errorf("%v matched %+v, want the limit of %d", tt.give, r, tt.want)
		}
	}
	if n := len(d.Rules()); n != 7 {
		t.Errorf("%d rules, want 7", n)
	}
	// The same descriptor in two files: named with both.
	write("c.yaml", `domain: web
descriptors:
  - key: ip
    rate_limit: {unit: hour, requests_per_unit: 9}
  - key: path
    value: /a*
    rate_limit: {unit: hour, requests_per_unit: 9}
  - key: path
    value: /exact
    rate_limit: {unit: hour, requests_per_unit: 9}
`)
	_, err = LoadWith(t.Context(), Options{MergeDomains: true}, dir)
	for _, want := range []string{
		filepath.Join(dir, "c.yaml") + ":3: web.ip: duplicate descriptor across merged files (also defined at " + filepath.Join(dir, "a.yaml") + ":3)",
		filepath.Join(dir, "c.yaml") + ":5: web.path_/a*: duplicate descriptor across merged files (also defined at " + filepath.Join(dir, "a.yaml") + ":5)",
		filepath.Join(dir, "c.yaml") + ":8: web.path_/exact: duplicate descriptor across merged files (also defined at " + filepath.Join(dir, "b.yaml") + ":6)",
	} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error lacks %q:\n%v", want, err)
		}
	}
}
