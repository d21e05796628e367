package main

import (
	"cmp"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"unicode"

	"github.com/prometheus/client_golang/prometheus"
)

var descFields = regexp.MustCompile(`fqName: "([^"]+)", help: "((?:[^"\\]|\\.)*)".*variableLabels: \{([^}]*)\}`)

// TestMetricList: the process registers exactly the metrics of
// deploy/metrics.txt, with their types and labels, whichever room owns
// them, and every help text reads as the others do. A renamed, dropped or
// relabelled metric breaks the dashboards and alerts that read it.
func TestMetricList(t *testing.T) {
	m := newMetrics("test")
	types := map[string]string{}
	fams, err := m.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		types[f.GetName()] = strings.ToLower(f.GetType().String())
	}
	ch := make(chan *prometheus.Desc)
	go func() { m.Registry.Describe(ch); close(ch) }()
	var got []string
	for d := range ch {
		f := descFields.FindStringSubmatch(d.String())
		if f == nil {
			t.Fatalf("cannot read %s", d)
		}
		name, help, labels := f[1], f[2], f[3]
		if !strings.HasPrefix(name, "ratelimitd_") {
			continue // Go's and the process's own
		}
		if help == "" || !unicode.IsUpper(rune(help[0])) && !unicode.IsDigit(rune(help[0])) || !strings.HasSuffix(help, ".") {
			t.Errorf("%s: help %q: want a sentence", name, help)
		}
		typ := types[name]
		if typ == "" { // a vector with no series yet: a counter is named _total
			typ = "gauge"
			if strings.HasSuffix(name, "_total") {
				typ = "counter"
			}
		}
		if strings.HasSuffix(name, "_total") != (typ == "counter") {
			t.Errorf("%s is a %s: only counters end in _total", name, typ)
		}
		got = append(got, fmt.Sprintf("%s %s %s", name, typ, cmp.Or(labels, "-")))
	}
	slices.Sort(got)
	data, err := os.ReadFile("../../deploy/metrics.txt")
	if err != nil {
		t.Fatal(err)
	}
	var want []string
	for _, l := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		if !strings.HasPrefix(l, "#") {
			want = append(want, l)
		}
	}
	for _, w := range want {
		if !slices.Contains(got, w) {
			t.Errorf("deploy/metrics.txt lists %q; the process does not register it so", w)
		}
	}
	for _, g := range got {
		if !slices.Contains(want, g) {
			t.Errorf("the process registers %q; deploy/metrics.txt does not list it", g)
		}
	}
}
