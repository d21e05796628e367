package deploy_test

import (
	"encoding/json"
	"fmt"
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/prometheus/prometheus/promql/parser"
	"gopkg.in/yaml.v3"

	"github.com/ratelimitd/ratelimitd/internal/metrics"
)

// exposed is every series the binary exports, each with the labels it
// carries: ratelimitd's own from deploy/metrics.txt (the list
// cmd/ratelimitd's TestMetricList holds the binary to, so a vector with no
// series yet counts too), and what the registry gathers of Go's and the
// process's. Histograms are their _bucket, _sum and _count series.
func exposed(t *testing.T) map[string]map[string]bool {
	t.Helper()
	out := map[string]map[string]bool{}
	add := func(name, typ string, labels ...string) {
		names := []string{name}
		switch typ {
		case "histogram":
			// A classic histogram has no series of the family's own name.
			names = []string{name + "_bucket", name + "_sum", name + "_count"}
		case "summary":
			names = append(names, name+"_sum", name+"_count")
		}
		for _, n := range names {
			if out[n] == nil {
				out[n] = map[string]bool{}
			}
			for _, l := range labels {
				if l != "" && l != "-" {
					out[n][l] = true
				}
			}
		}
		switch typ {
		case "histogram":
			out[name+"_bucket"]["le"] = true
		case "summary":
			out[name]["quantile"] = true
		}
	}
	list, err := os.ReadFile("metrics.txt")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(strings.TrimSpace(string(list)), "\n") {
		f := strings.Fields(l)
		if strings.HasPrefix(l, "#") {
			continue
		}
		if len(f) != 3 {
			t.Fatalf("metrics.txt: %q: want name, type, labels", l)
		}
		add(f[0], f[1], strings.Split(f[2], ",")...)
	}
	fams, err := metrics.New("test").Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if strings.HasPrefix(f.GetName(), "ratelimitd_") {
			continue
		}
		var labels []string
		for _, s := range f.GetMetric() {
			for _, l := range s.GetLabel() {
				labels = append(labels, l.GetName())
			}
		}
		add(f.GetName(), strings.ToLower(f.GetType().String()), labels...)
	}
	return out
}

// grafanaVars are Grafana's own variables, replaced by a duration for
// parsing.
var grafanaVars = regexp.MustCompile(`\$__(rate_interval|interval|range)`)

// checkPromQL parses expr with Prometheus's own parser and reports every
// metric it selects that the binary does not export, and every label it
// matches or groups by that the metric does not carry.
func checkPromQL(expr string, series map[string]map[string]bool) []error {
	e, err := parser.NewParser(parser.Options{}).ParseExpr(grafanaVars.ReplaceAllString(expr, "5m"))
	if err != nil {
		return []error{fmt.Errorf("%q: %w", expr, err)}
	}
	var errs []error
	labelsOf := func(n parser.Node) map[string]bool {
		all := map[string]bool{}
		parser.Inspect(n, func(c parser.Node, _ []parser.Node) error {
			if vs, ok := c.(*parser.VectorSelector); ok {
				for l := range series[vs.Name] {
					all[l] = true
				}
			}
			return nil
		})
		return all
	}
	parser.Inspect(e, func(n parser.Node, _ []parser.Node) error {
		switch n := n.(type) {
		case *parser.VectorSelector:
			labels, ok := series[n.Name]
			if !ok {
				errs = append(errs, fmt.Errorf("%q selects %s, which ratelimitd does not export", expr, n.Name))
				return nil
			}
			for _, m := range n.LabelMatchers {
				if m.Name != "__name__" && !labels[m.Name] {
					errs = append(errs, fmt.Errorf("%q matches label %s, which %s does not carry", expr, m.Name, n.Name))
				}
			}
		case *parser.AggregateExpr:
			if n.Without {
				return nil
			}
			have := labelsOf(n.Expr)
			for _, l := range n.Grouping {
				if !have[l] {
					errs = append(errs, fmt.Errorf("%q groups by %s, which none of its metrics carries", expr, l))
				}
			}
		}
		return nil
	})
	return errs
}

// dashboardExprs are the queries of every panel of a Grafana dashboard.
func dashboardExprs(t *testing.T, data []byte) []string {
	t.Helper()
	var d struct {
		SchemaVersion int
		Panels        []struct {
			Title   string
			Targets []struct{ Expr string }
		}
	}
	if err := json.Unmarshal(data, &d); err != nil {
		t.Fatal(err)
	}
	if d.SchemaVersion < 36 {
		t.Errorf("schemaVersion %d: current Grafana wants 36 or later", d.SchemaVersion)
	}
	var out []string
	for _, p := range d.Panels {
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, tg := range p.Targets {
			out = append(out, tg.Expr)
		}
	}
	return out
}

// TestDashboardUsesRealMetrics: every panel's query and every alert parses
// as PromQL and names only metrics and labels ratelimitd exports, so the
// dashboard and the alerts cannot drift from the code.
func TestDashboardUsesRealMetrics(t *testing.T) {
	series := exposed(t)
	dash, err := os.ReadFile("grafana/ratelimitd.json")
	if err != nil {
		t.Fatal(err)
	}
	exprs := dashboardExprs(t, dash)
	if len(exprs) < 20 {
		t.Errorf("%d queries in the dashboard", len(exprs))
	}
	alerts, _ := os.ReadFile("prometheus/alerts.yaml")
	var a struct {
		Groups []struct {
			Rules []struct{ Alert, Expr string }
		}
	}
	if err := yaml.Unmarshal(alerts, &a); err != nil {
		t.Fatal(err)
	}
	for _, g := range a.Groups {
		for _, r := range g.Rules {
			exprs = append(exprs, r.Expr)
		}
	}
	for _, e := range exprs {
		for _, err := range checkPromQL(e, series) {
			t.Error(err)
		}
	}
	// Each of the dashboard's subjects has a panel.
	for _, m := range []string{"ratelimitd_decisions_total", "ratelimitd_requests_total", "ratelimitd_redis_breaker_open",
		"ratelimitd_redis_batch_size_sum", "ratelimitd_lease_hits_total", "ratelimitd_lease_refills_total",
		"ratelimitd_config_reloads_total", "ratelimitd_xds_connected", "ratelimitd_request_duration_seconds_bucket",
		"ratelimitd_redis_duration_seconds_bucket"} {
		if !strings.Contains(string(dash), m) {
			t.Errorf("no panel shows %s", m)
		}
	}
}

// TestDashboardCheckCatches: the check fails a panel naming a metric that
// does not exist, a label its metric lacks, a grouping by such a label,
// and a query that does not parse.
func TestDashboardCheckCatches(t *testing.T) {
	series := exposed(t)
	for expr, want := range map[string]string{
		`sum(rate(ratelimitd_decisons_total[$__rate_interval]))`:                       "selects ratelimitd_decisons_total",
		`sum(rate(ratelimitd_decisions_total{result="ok"}[5m]))`:                       "matches label result",
		`sum by (code) (rate(ratelimitd_decisions_total[$__rate_interval]))`:           "groups by code",
		`histogram_quantile(0.9, sum by (le) (rate(ratelimitd_redis_batch_size[5m])))`: "selects ratelimitd_redis_batch_size,",
		`sum(rate(ratelimitd_decisions_total[5m])`:                                     "unclosed",
	} {
		errs := checkPromQL(expr, series)
		if !strings.Contains(fmt.Sprint(errs), want) {
			t.Errorf("%s: %v, want an error with %q", expr, errs, want)
		}
	}
	bad := []byte(`{"schemaVersion": 39, "panels": [{"title": "x", "targets": [{"expr": "rate(ratelimitd_nope_total[5m])"}]}]}`)
	for _, e := range dashboardExprs(t, bad) {
		if len(checkPromQL(e, series)) == 0 {
			t.Errorf("a panel naming ratelimitd_nope_total passes")
		}
	}
	if errs := checkPromQL(`sum by (outcome) (rate(ratelimitd_decisions_total{domain="d"}[$__rate_interval]))`, series); len(errs) > 0 {
		t.Errorf("a good query fails: %v", errs)
	}
}
