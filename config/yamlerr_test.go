package config

import (
	"errors"
	"fmt"
	"strings"
	"testing"
)

// TestYAMLErrorLines: a YAML syntax error names the line of the fault,
// where yaml.v3 names the line its construct began on or the one before
// (a flow sequence left open on line 7 was "line 6", a tab on line 4
// "line 3").
func TestYAMLErrorLines(t *testing.T) {
	for _, tt := range []struct {
		name, src string
		line      int
	}{
		{"flow sequence left open", "a: 1\nb: 2\nc: 3\nd: [oops\ne: 5\n", 4},
		{"flow mapping left open", "a: 1\nb: 2\nc: {x: 1\nd: 4\n", 3},
		{"tab in a block", "a:\n  - key: a\n    v: 1\n\tr: 2\n", 4},
		{"tab at the top", "a: 1\nb:\n\tc: 2\n", 3},
		{"key misindented", "a:\n  b: 1\n  c: 2\n d: 3\ne: 4\n", 4},
		{"sequence entry misindented", "a:\n  - x: 1\n  - y: 2\n   z: 3\n", 4},
		{"quote left open", "a: 1\nb: 2\nc: \"abc\nd: 4\n", 3},
		{"a second colon", "a: 1\nb: 2\nc: d: e\n", 3},
		{"a character no token starts with", "a: 1\nb: 2\n@c: 3\n", 3},
		{"a sequence entry in a mapping", "a: 1\nb: 2\n- c\n", 3},
		{"a sequence entry among keys", "a:\n  b: 1\n  - c\n", 3},
		{"in the second document", "a: 1\n---\nb: [\n", 3},
		{"a valid flow over lines before it", "a: {x: 1,\n  y: 2}\nb: 1\n  c: 2\n", 4},
		{"no newline at the end", "a: 1\nb: [x", 2},
	} {
		_, err := parseDoc(t.Context(), Doc{Name: "r.yaml", Data: []byte(tt.src), Lines: true})
		var e *Error
		if !errors.As(err, &e) || e.Line != tt.line || !strings.HasPrefix(e.Msg, "invalid YAML: ") || strings.Contains(e.Msg, "line") {
			t.Errorf("%s: %v, want r.yaml:%d: invalid YAML: <yaml's message without its line>", tt.name, err, tt.line)
		}
	}
}

// TestYAMLErrorLineInALargeFile: an ordinary large rules file (hundreds
// of KiB: thousands of descriptors) still names the fault's line, not
// yaml.v3's, up to the bisection's bound of 1 MiB.
func TestYAMLErrorLineInALargeFile(t *testing.T) {
	var b strings.Builder
	b.WriteString("domain: big\ndescriptors:\n")
	for i := range 3000 {
		fmt.Fprintf(&b, "  - key: tenant\n    value: t%05d\n    rate_limit: {unit: minute, requests_per_unit: %d}\n", i, 100+i)
	}
	// A flow sequence left open: yaml.v3 names the line before.
	fault := strings.Count(b.String(), "\n") + 1
	b.WriteString("  - key: x\n    value: [oops\n  - key: y\n")
	src := b.String()
	if len(src) < 200<<10 {
		t.Fatalf("the file is %d bytes, want a large one", len(src))
	}
	_, err := parseDoc(t.Context(), Doc{Name: "r.yaml", Data: []byte(src), Lines: true})
	var e *Error
	if !errors.As(err, &e) || e.Line != fault+1 {
		t.Errorf("a %d KiB file with a fault on line %d: %v", len(src)>>10, fault+1, err)
	}
}
