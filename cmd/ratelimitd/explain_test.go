package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
)

const explainRules = `
domain: web
descriptors:
  - key: ip
    rate_limit: {unit: minute, requests_per_unit: 100, name: per-ip}
  - key: vip
    rate_limit:
      unit: minute
      unit_multiplier: 5
      requests_per_unit: 1000
      algorithm: token_bucket
      burst: 50
      replaces: [{name: per-ip}]
  - key: path
    value: /admin
    shadow_mode: true
    failure_mode: deny
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: health
    rate_limit: {unlimited: true}
  - key: group
`

// TestExplain: each descriptor's rule, file and line, limit and modes, as
// the server would treat it: replaced limits, unlimited rules, rules
// without a limit, unknown descriptors; and the same as JSON.
func TestExplain(t *testing.T) {
	rules := writeRules(t, explainRules)
	var out syncBuffer
	err := run(context.Background(), []string{"explain", "--config", rules, "web", "ip=1", "vip=v", "path=/admin", "health=x", "group=g", "nope=1"}, env(nil), &out, &out)
	if err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	for _, want := range []string{
		`descriptors[0] ip=1: rule web.ip (` + rules + `:4): its limit "per-ip" is replaced by the limit of web.vip (another descriptor of the request): not limited`,
		`descriptors[1] vip=v: rule web.vip (` + rules + `:6): 1000 per 5 minutes, token_bucket burst 50, replaces per-ip`,
		`descriptors[2] path=/admin: rule web.path_/admin (` + rules + `:14): 1 per second, fixed_window, shadow mode, failure_mode deny`,
		`descriptors[3] health=x: rule web.health (` + rules + `:19): unlimited`,
		`descriptors[4] group=g: rule web.group (` + rules + `:21): no rate_limit: not limited`,
		`descriptors[5] nope=1: no rule: not limited`,
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
	var js syncBuffer
	if err := run(context.Background(), []string{"explain", "--config", rules, "--json", "web", "vip=v"}, env(nil), &js, &js); err != nil {
		t.Fatal(err)
	}
	var got []struct {
		Outcome string `json:"outcome"`
		Rule    struct {
			Path      string `json:"path"`
			Line      int    `json:"line"`
			Algorithm string `json:"algorithm"`
			Burst     int    `json:"burst"`
		} `json:"rule"`
	}
	if err := json.Unmarshal([]byte(js.String()), &got); err != nil || len(got) != 1 {
		t.Fatalf("--json: %v\n%s", err, js.String())
	}
	if g := got[0]; g.Outcome != "limited" || g.Rule.Path != "web.vip" || g.Rule.Line != 6 || g.Rule.Algorithm != "token_bucket" || g.Rule.Burst != 50 {
		t.Errorf("--json = %+v", g)
	}
	// Bad input names the problem.
	var bad syncBuffer
	if err := run(context.Background(), []string{"explain", "--config", rules, "web", "novalue"}, env(nil), &bad, &bad); err == nil || !strings.Contains(err.Error(), `descriptor "novalue": want key=value`) {
		t.Errorf("a descriptor without '=': %v", err)
	}
}
