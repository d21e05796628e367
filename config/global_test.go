package config

import (
	"context"
	"strings"
	"testing"
)

// TestGlobalDomains: --global-domains makes every limit of the domains it
// names (exactly, or by a prefix ending in '*') global, leaves unlimited
// rules and other domains alone, and refuses, naming the rule, a limit
// there that cannot be global.
func TestGlobalDomains(t *testing.T) {
	docs := []Doc{
		{Name: "eg", Data: []byte("domain: default/eg/http\ndescriptors:\n  - key: route\n    rate_limit: {unit: minute, requests_per_unit: 5}\n  - key: free\n    rate_limit: {unlimited: true}\n")},
		{Name: "ai", Data: []byte("domain: ai-gateway-quota\ndescriptors:\n  - key: bucket\n    rate_limit: {unit: hour, requests_per_unit: 1000}\n")},
		{Name: "other", Data: []byte("domain: other\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 1}\n")},
	}
	snap, err := LoadDocs(context.Background(), Options{GlobalDomains: []string{"default/eg/http", "ai-*"}}, docs)
	if err != nil {
		t.Fatal(err)
	}
	global := map[string]bool{}
	for _, name := range snap.Domains() {
		for _, r := range snap.Domain(name).Rules() {
			if r.Limit != nil {
				global[r.Path] = r.Limit.Global
			}
		}
	}
	want := map[string]bool{"default/eg/http.route": true, "default/eg/http.free": false, "ai-gateway-quota.bucket": true, "other.k": false}
	for path, g := range want {
		if global[path] != g {
			t.Errorf("%s: global %v, want %v (all: %v)", path, global[path], g, global)
		}
	}
	leased := []Doc{{Name: "l.yaml", Lines: true, Data: []byte("domain: ai-x\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 1, lease: true}\n")}}
	_, err = LoadDocs(context.Background(), Options{GlobalDomains: []string{"ai-*"}}, leased)
	if err == nil || !strings.Contains(err.Error(), "ai-x.k") || !strings.Contains(err.Error(), "--global-domains") || !strings.Contains(err.Error(), "l.yaml:3") {
		t.Errorf("a leased limit in a global domain: %v; want an error naming the rule, its line and the flag", err)
	}
}
