package config

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
)

func TestBadConfigs(t *testing.T) {
	tests := []struct {
		file    string
		wantErr []string
	}{
		{"empty_domain.bad.yaml", []string{"empty_domain.bad.yaml:1: domain: missing or empty domain"}},
		{"empty_key.bad.yaml", []string{"empty_key.bad.yaml:3: descriptors[0].key: missing or empty key"}},
		{"duplicate_key.bad.yaml", []string{":6: descriptors[1]: duplicate descriptor d.key1_value1 (first defined at line 3)"}},
		{"duplicate_key_only.bad.yaml", []string{":5: descriptors[1]: duplicate descriptor d.key1 (first defined at line 3)"}},
		{"duplicate_field.bad.yaml", []string{`:4: descriptors[0]: duplicate field "key"`}},
		{"bad_unit.bad.yaml", []string{`:5: descriptors[0].rate_limit.unit: unknown unit "fortnight"`}},
		{"missing_unit.bad.yaml", []string{":5: descriptors[0].rate_limit.unit: missing unit"}},
		{"missing_limit.bad.yaml", []string{":5: descriptors[0].rate_limit.requests_per_unit: missing requests_per_unit"}},
		{"negative_limit.bad.yaml", []string{":6: descriptors[0].rate_limit.requests_per_unit: -1 is out of range"}},
		{"huge_limit.bad.yaml", []string{":6: descriptors[0].rate_limit.requests_per_unit: 2251799813685248 is out of range (0 to 2251799813685247)"}},
		{"huge_sliding_limit.bad.yaml", []string{":4: descriptors[0].rate_limit.requests_per_unit: 5000000000 is more than 4294967295, the most a sliding_window counts (fixed_window counts up to 2251799813685247)"}},
		{"huge_bucket_limit.bad.yaml", []string{":4: descriptors[0].rate_limit.requests_per_unit: 5000000000 is more than 4294967295, the most a token_bucket counts (fixed_window counts up to 2251799813685247)"}},
		{"float_limit.bad.yaml", []string{`:6: descriptors[0].rate_limit.requests_per_unit: want a whole number, got float "1.5"`}},
		{"unlimited_with_unit.bad.yaml", []string{":6: descriptors[0].rate_limit.unit: unlimited: true must not have a unit"}},
		{"misspelled_key.bad.yaml", []string{`:4: descriptors[0]: unknown field "ratelimit"`}},
		{"misspelled_key2.bad.yaml", []string{`:6: descriptors[0].rate_limit: unknown field "requestsperunit"`}},
		{"replaces_self.bad.yaml", []string{`:9: descriptors[0].rate_limit.replaces[0].name: a limit cannot replace itself ("self")`}},
		{"replaces_empty.bad.yaml", []string{":8: descriptors[0].rate_limit.replaces[0].name: empty replaces name"}},
		{"bad_yaml.bad.yaml", []string{"bad_yaml.bad.yaml:1: invalid YAML: found unexpected end of stream"}},
		{"non_string_key.bad.yaml", []string{`non_string_key.bad.yaml:1: key "0.25" is not a string`}},
		{"non_map_list.bad.yaml", []string{":2: descriptors[0]: want a mapping, got str"}},
		{"descriptors_map.bad.yaml", []string{":3: descriptors: want a list of descriptors, got a mapping"}},
		{"share_threshold_no_wildcard.bad.yaml", []string{":5: descriptors[0].share_threshold: share_threshold needs a wildcard value"}},
		{"request_id_valued.bad.yaml", []string{":5: descriptors[0].request_id: request_id needs a key-only level that holds the rate_limit"}},
		{"multi_doc.bad.yaml", []string{":7: descriptors[0].key: missing or empty key"}},
		{"unlimited_lease.bad.yaml", []string{":6: descriptors[0].rate_limit.lease: an unlimited rule has nothing to lease"}},
		{"rejected_hits_unknown.bad.yaml", []string{`:4: descriptors[0].rate_limit.rejected_hits: unknown rejected_hits "all" (want usage or nothing)`}},
		{"rejected_hits_lease.bad.yaml", []string{":8: descriptors[0].rate_limit.rejected_hits: a usage budget cannot be leased (drop lease, or set rejected_hits: nothing)"}},
		{"rejected_hits_rlqs.bad.yaml", []string{":2: rlqs: rule d.k sets rejected_hits: usage, and RLQS buckets count requests, not usage"}},
		{"calendar_hour.bad.yaml", []string{":4: descriptors[0].rate_limit.calendar: calendar needs unit month or year, no unit_multiplier, algorithm fixed_window and no lease"}},
		{"calendar_multiplier.bad.yaml", []string{":4: descriptors[0].rate_limit.calendar: calendar needs unit month or year, no unit_multiplier"}},
		{"calendar_lease.bad.yaml", []string{":4: descriptors[0].rate_limit.calendar: calendar needs unit month or year"}},
		{"calendar_rlqs.bad.yaml", []string{":2: rlqs: rule d.k sets calendar: true, and RLQS grants count windows of fixed length"}},
		{"rejected_hits_unlimited.bad.yaml", []string{":4: descriptors[0].rate_limit.rejected_hits: an unlimited rule counts nothing"}},
		{"metadata_timestamp.bad.yaml", []string{":6: descriptors[0].metadata: cannot be returned as a protobuf Struct in a response's dynamic metadata", "invalid type: time.Time"}},
		{"metadata_large.bad.yaml", []string{":6: descriptors[0].metadata: 17018 bytes as a protobuf Struct, more than the 16384 a response may carry"}},
		{"bad_bool.bad.yaml", []string{`:4: descriptors[0].shadow_mode: want true or false, got str "yes please"`}},
		{"empty.bad.yaml", []string{"empty.bad.yaml: empty file"}},
		{"bad_algorithm.bad.yaml", []string{`:7: descriptors[0].rate_limit.algorithm: unknown algorithm "leaky" (want fixed_window, sliding_window or token_bucket)`}},
		{"burst_without_bucket.bad.yaml", []string{":8: descriptors[0].rate_limit.burst: burst needs algorithm: token_bucket"}},
		{"zero_multiplier.bad.yaml", []string{":7: descriptors[0].rate_limit.unit_multiplier: 0 is out of range (1 to 4294967295)"}},
		// Negative numbers are refused, not wrapped to about 4.29e9, in
		// one message naming the field's own range.
		{"negative_multiplier.bad.yaml", []string{":7: descriptors[0].rate_limit.unit_multiplier: -1 is out of range (1 to 4294967295)"}},
		// Digits past 64 bits, which YAML reads as a float: out of range.
		{"overflow_limit.bad.yaml", []string{":6: descriptors[0].rate_limit.requests_per_unit: 99999999999999999999 is out of range (0 to "}},
		{"duplicate_domain_docs.bad.yaml", []string{`duplicate_domain_docs.bad.yaml:6: duplicate domain "d" (already defined at testdata/duplicate_domain_docs.bad.yaml:1;`}},
		{"negative_burst.bad.yaml", []string{":8: descriptors[0].rate_limit.burst: -1 is out of range (1 to 4294967295)"}},
		{"bad_failure_mode.bad.yaml", []string{`:4: descriptors[0].failure_mode: unknown failure_mode "closed" (want allow or deny)`}},
		{"rlqs_duplicate_key.bad.yaml", []string{`:3: rlqs.descriptor_keys[1]: duplicate key "tenant"`}},
		{"many_errors.bad.yaml", []string{`:5: descriptors[0].rate_limit.unit: unknown unit "fortnight"`,
			":6: descriptors[0].rate_limit.requests_per_unit: -3 is out of range", ":7: descriptors[1].key: missing or empty key"}},
	}
	seen := map[string]bool{}
	for _, tt := range tests {
		seen[tt.file] = true
		t.Run(tt.file, func(t *testing.T) {
			path := filepath.Join("testdata", tt.file)
			snap, err := Load(path)
			if err == nil {
				t.Fatalf("Load(%s) = %v, want an error", path, snap)
			}
			for _, want := range tt.wantErr {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q\ndoes not contain %q", err, want)
				}
			}
			if strings.Contains(err.Error(), "out of range") && strings.Contains(err.Error(), "must be at least") {
				t.Errorf("error %q: two ranges for one value", err)
			}
			if !strings.HasPrefix(err.Error(), path) {
				t.Errorf("error %q does not start with the file name", err)
			}
		})
	}
	bad, _ := filepath.Glob("testdata/*.bad.yaml")
	for _, f := range bad {
		if !seen[filepath.Base(f)] {
			t.Errorf("%s has no expected error in TestBadConfigs", f)
		}
	}
}

func entries(kv ...string) []*rlcommon.RateLimitDescriptor_Entry {
	var out []*rlcommon.RateLimitDescriptor_Entry
	for i := 0; i+1 < len(kv); i += 2 {
		out = append(out, &rlcommon.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	return out
}

func TestGoodConfig(t *testing.T) {
	snap, err := Load("testdata/basic.good.yaml")
	if err != nil {
		t.Fatal(err)
	}
	d := snap.Domain("test-domain")
	if d == nil {
		t.Fatal("domain test-domain missing")
	}
	tests := []struct {
		name     string
		give     []string
		wantPath string // "" = no match
		wantRPU  uint64
		wantUnit Unit
	}{
		{"exact", []string{"key1", "value1"}, "test-domain.key1_value1", 5, UnitMinute},
		{"nested key-only", []string{"key1", "value1", "subkey1", "x"}, "test-domain.key1_value1.subkey1", 10, UnitSecond},
		{"deeper than config", []string{"key1", "value1", "subkey1", "x", "z", "z"}, "", 0, 0},
		{"key-only any value", []string{"key2", "anything"}, "test-domain.key2", 20, UnitHour},
		{"key-only empty value", []string{"key2", ""}, "test-domain.key2", 20, UnitHour},
		{"unknown value no default", []string{"key1", "other"}, "", 0, 0},
		{"unknown key", []string{"nokey", "v"}, "", 0, 0},
		{"trailing wildcard", []string{"key3", "/api/users"}, "test-domain.key3_/api/*", 3, UnitDay},
		{"wildcard zero chars", []string{"key3", "/api/"}, "test-domain.key3_/api/*", 3, UnitDay},
		{"middle wildcards", []string{"key3", "/aXXbYYc"}, "test-domain.key3_/a*b*c", 4, UnitWeek},
		{"middle wildcards out of order", []string{"key3", "/acb"}, "", 0, 0},
		{"whitelist int value", []string{"whitelist", "123"}, "test-domain.whitelist_123", 0, 0},
		{"shadow", []string{"shadow", "v"}, "test-domain.shadow", 0, UnitYear},
		// The incumbent matches wildcards on "key_value", so key "key3_/api" with
		// value "x" would share key3's counter; we never match across keys.
		{"no match across key boundary", []string{"key3_/api", "x"}, "", 0, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := d.Match(entries(tt.give...))
			if tt.wantPath == "" {
				if r != nil {
					t.Fatalf("Match = %s, want no match", r.Path)
				}
				return
			}
			if r == nil {
				t.Fatalf("Match = nil, want %s", tt.wantPath)
			}
			if r.Path != tt.wantPath {
				t.Fatalf("Match = %s, want %s", r.Path, tt.wantPath)
			}
			if tt.wantUnit != 0 && (r.Limit == nil || r.Limit.RequestsPerUnit != tt.wantRPU || r.Limit.Unit != tt.wantUnit) {
				t.Fatalf("limit = %+v, want %d/%s", r.Limit, tt.wantRPU, tt.wantUnit)
			}
		})
	}
	unl := d.Match(entries("unl", "x"))
	if unl == nil || !unl.Limit.Unlimited || len(unl.Limit.Replaces) != 1 || unl.Limit.Replaces[0] != "per-key2" {
		t.Errorf("unlimited rule = %+v", unl.Limit)
	}
	sh := d.Match(entries("shadow", "v"))
	if !sh.ShadowMode || !sh.DetailedMetric || sh.Metadata.GetFields()["team"].GetStringValue() != "payments" {
		t.Errorf("shadow rule = %+v", sh)
	}
	if fm := d.Match(entries("key2", "x")).FailureMode; fm != FailureDeny {
		t.Errorf("key2 failure_mode = %v, want deny", fm)
	}
	if fm := d.Match(entries("key1", "value1")).FailureMode; fm != FailureUnset {
		t.Errorf("key1 failure_mode = %v, want unset", fm)
	}
	if !d.Match(entries("key3", "/api/x")).ShareThreshold {
		t.Error("share_threshold lost")
	}
	if got := d.Match(entries("key1", "value1")); got.Line != 3 || got.File != "testdata/basic.good.yaml" {
		t.Errorf("rule location = %s:%d", got.File, got.Line)
	}
	if !strings.Contains(snap.Dump(), "test-domain.key1_value1: unit=minute requests_per_unit=5") {
		t.Errorf("Dump:\n%s", snap.Dump())
	}
}

func TestWildcardFirstInFileOrderWins(t *testing.T) {
	snap, err := Parse("w.yaml", []byte(`
domain: w
descriptors:
  - key: p
    value: "a*"
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: p
    value: "ab*"
    rate_limit: {unit: second, requests_per_unit: 2}
  - key: p
    rate_limit: {unit: second, requests_per_unit: 3}
`))
	if err != nil {
		t.Fatal(err)
	}
	d := snap.Domain("w")
	if got := d.Match(entries("p", "abc")).Limit.RequestsPerUnit; got != 1 {
		t.Errorf("abc matched limit %d, want the first wildcard's 1", got)
	}
	if got := d.Match(entries("p", "zzz")).Limit.RequestsPerUnit; got != 3 {
		t.Errorf("zzz matched limit %d, want the key-only 3", got)
	}
}

func TestNoBacktracking(t *testing.T) {
	// envoyproxy/ratelimit is greedy: once the exact value matched, its
	// key-only sibling is never tried for deeper entries. We keep that so a
	// rules file decides the same way in both services.
	snap, err := Parse("b.yaml", []byte(`
domain: b
descriptors:
  - key: a
    value: x
    descriptors:
      - key: c
        value: only
        rate_limit: {unit: second, requests_per_unit: 1}
  - key: a
    descriptors:
      - key: c
        rate_limit: {unit: second, requests_per_unit: 2}
`))
	if err != nil {
		t.Fatal(err)
	}
	if r := snap.Domain("b").Match(entries("a", "x", "c", "other")); r != nil {
		t.Errorf("Match = %s, want nil (no backtracking)", r.Path)
	}
	if r := snap.Domain("b").Match(entries("a", "y", "c", "other")); r == nil || r.Limit.RequestsPerUnit != 2 {
		t.Errorf("Match = %v, want the key-only child", r)
	}
}

func TestLoadDirectory(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("a.yaml", "domain: a\n")
	write("b.yml", "domain: b\n")
	write(".hidden.yaml", "not: valid: yaml: [")
	write("notes.txt", "ignored")
	if err := os.Mkdir(filepath.Join(dir, "..data"), 0o700); err != nil {
		t.Fatal(err)
	}
	snap, err := Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(snap.Domains(), ","); got != "a,b" {
		t.Errorf("domains = %s, want a,b", got)
	}
	write("c.yaml", "domain: a\n")
	_, err = Load(dir)
	if err == nil || !strings.Contains(err.Error(), `c.yaml:1: duplicate domain "a" (already defined at `+filepath.Join(dir, "a.yaml")+":1") {
		t.Errorf("duplicate domain error = %v", err)
	}
	if _, err := Load(t.TempDir()); err == nil || !strings.Contains(err.Error(), "no *.yaml or *.yml rules files") {
		t.Errorf("empty dir error = %v", err)
	}
	if _, err := Load(filepath.Join(dir, "missing.yaml")); err == nil || !strings.Contains(err.Error(), "missing.yaml") {
		t.Errorf("missing file error = %v", err)
	}
}

func FuzzLoadConfig(f *testing.F) {
	files, _ := filepath.Glob("testdata/*.yaml")
	for _, file := range files {
		data, _ := os.ReadFile(file)
		f.Add(data)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		snap, err := Parse("fuzz.yaml", data)
		if (snap == nil) == (err == nil) {
			t.Fatalf("Parse returned snapshot %v and error %v", snap, err)
		}
		if snap != nil {
			_ = snap.Dump()
			for _, name := range snap.Domains() {
				snap.Domain(name).Match(entries("k", "v", "k2", "v2"))
			}
		}
	})
}

func TestAlgorithms(t *testing.T) {
	snap, err := Load("testdata/algorithms.good.yaml")
	if err != nil {
		t.Fatal(err)
	}
	d := snap.Domain("algos")
	f := d.Match(entries("fixed", "x")).Limit
	if f.Algorithm != AlgorithmFixedWindow || f.UnitMultiplier != 5 || f.Window() != 5*time.Minute {
		t.Errorf("fixed = %+v", f)
	}
	if s := d.Match(entries("sliding", "x")).Limit; s.Algorithm != AlgorithmSlidingWindow || s.Window() != time.Minute {
		t.Errorf("sliding = %+v", s)
	}
	if b := d.Match(entries("bucket", "x")).Limit; b.Algorithm != AlgorithmTokenBucket || b.Burst != 20 {
		t.Errorf("bucket = %+v", b)
	}
	if l := d.Match(entries("leased", "x")).Limit; !l.Lease || d.Match(entries("bucket", "x")).Limit.Lease {
		t.Errorf("leased = %+v", l)
	}
	if !strings.Contains(snap.Dump(), "algos.leased: unit=second requests_per_unit=1000 lease=true") {
		t.Errorf("Dump:\n%s", snap.Dump())
	}
	if !strings.Contains(snap.Dump(), "algos.bucket: unit=second requests_per_unit=10 algorithm=token_bucket burst=20") {
		t.Errorf("Dump:\n%s", snap.Dump())
	}
}

// TestGeneratorOutput loads a file as a generator writes RateLimitConfigs
// (Envoy Gateway's translator): several documents, each a domain, every
// field written out, rate_limit: null meaning no limit, upper-case units.
// The incumbent loads only the first document of such a file.
func TestGeneratorOutput(t *testing.T) {
	snap, err := Load("testdata/generator.good.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if got := snap.Domains(); len(got) != 2 || got[0] != "first-listener" || got[1] != "test-namespace/test-policy-1" {
		t.Fatalf("domains %v", got)
	}
	for _, c := range []struct {
		domain string
		ents   []string
		unit   Unit
		rpu    uint64
		line   int
	}{
		{"first-listener", []string{"first-route", "", "rule-0-match-0", "rule-0-match-0"}, UnitMonth, 5, 11},
		{"first-listener", []string{"second-route", "", "rule-0-match-0", "rule-0-match-0"}, UnitYear, 1, 34},
		{"test-namespace/test-policy-1", []string{"test-namespace/test-policy-1/rule/0", "test-namespace/test-policy-1/rule/0", "rule-0-match-0", "rule-0-match-0"}, UnitWeek, 5, 55},
	} {
		d := snap.Domain(c.domain)
		r := d.Match(entries(c.ents...))
		if r == nil || r.Limit == nil || r.Limit.Unit != c.unit || r.Limit.RequestsPerUnit != c.rpu || r.Line != c.line {
			t.Errorf("%s %v: %+v", c.domain, c.ents, r)
			continue
		}
		if p := r.Parent(); p.Limit != nil {
			t.Errorf("%s: rate_limit: null gave a limit %+v", p.Path, p.Limit)
		}
	}
	if d := snap.Domain("first-listener"); d.ConfigName != "first-listener" {
		t.Errorf("config name %q", d.ConfigName)
	}
	// One domain twice in one file is the error two files make.
	_, err = Parse("two.yaml", []byte("domain: d\n---\ndomain: d\n"))
	if err == nil || !strings.Contains(err.Error(), `duplicate domain "d"`) {
		t.Errorf("a domain twice: %v", err)
	}
	// Strictness stays: a misspelled field in a later document.
	_, err = Parse("typo.yaml", []byte("domain: a\n---\ndomain: b\ndescriptor: []\n"))
	if err == nil || !strings.Contains(err.Error(), `typo.yaml:4: unknown field "descriptor"`) {
		t.Errorf("typo in the second document: %v", err)
	}
	// A domain whose descriptors are written out empty or null has no
	// rules, and is no error.
	for _, doc := range []string{"domain: e\ndescriptors:\n", "domain: e\ndescriptors: null\n", "domain: e\ndescriptors: []\n"} {
		if s, err := Parse("empty.yaml", []byte(doc)); err != nil || s.Domain("e") == nil || len(s.Domain("e").Rules()) != 0 {
			t.Errorf("%q: %v", doc, err)
		}
	}
	// Comments and '---' alone are no domain.
	if _, err := Parse("empty.yaml", []byte("---\n# nothing\n---\n")); err == nil || !strings.Contains(err.Error(), "empty file") {
		t.Errorf("documents without a domain: %v", err)
	}
}

// TestWildcardStarsMatchNothing: each '*' matches zero bytes too, at the
// end, at the start, or between parts that then touch; parts out of
// order, or overlapping, do not match.
func TestWildcardStarsMatchNothing(t *testing.T) {
	for _, c := range []struct {
		pattern, value string
		want           bool
	}{
		{"/api/*", "/api/", true},
		{"*.example.com", ".example.com", true},
		{"a*b*c", "abc", true},
		{"a*b*c", "a-b-c", true},
		{"a*bc*bd", "abcbd", true},
		{"a*b*c", "acb", false},
		{"ab*ba", "aba", false},
		{"a*b*c*d", "abdc", false},
	} {
		if got := wildcardMatch(strings.Split(c.pattern, "*"), c.value); got != c.want {
			t.Errorf("%q against %q: %v, want %v", c.value, c.pattern, got, c.want)
		}
	}
}

// TestLevels: a matched rule's ancestry, one rule per entry, nil past it.
func TestLevels(t *testing.T) {
	snap, err := Parse("r.yaml", []byte("domain: d\ndescriptors:\n  - key: a\n    descriptors:\n      - key: b\n        rate_limit: {unit: second, requests_per_unit: 1}\n"))
	if err != nil {
		t.Fatal(err)
	}
	r := snap.Domain("d").Match(entries("a", "1", "b", "2"))
	if r == nil {
		t.Fatal("no match")
	}
	got := r.Levels(3)
	if got[0] != nil || got[1] == nil || got[1].Key != "a" || got[2] != r {
		t.Errorf("levels of a 2-deep rule over 3 entries: %+v", got)
	}
	if l := r.Levels(1); len(l) != 1 || l[0] != r {
		t.Errorf("levels over 1 entry: %+v", l)
	}
	var none *Rule
	if l := none.Levels(2); l[0] != nil || l[1] != nil {
		t.Errorf("levels of no rule: %+v", l)
	}
}

// TestRequestIDLevels: a level marked request_id loads as one; a limit
// on every value of a key named like a request id without the mark
// counts each request alone, and the load warns so.
func TestRequestIDLevels(t *testing.T) {
	const body = "domain: d\ndescriptors:\n  - key: user\n    descriptors:\n      - key: %s\n%s        rate_limit: {unit: hour, requests_per_unit: 10}\n"
	for _, tc := range []struct {
		key, extra string
		warn       bool
	}{
		{"x-request-id", "", true},
		{"request_id", "", true},
		{"x-request-id", "        request_id: true\n", false},
		{"model", "", false},
	} {
		snap, err := Parse("rules.yaml", []byte(fmt.Sprintf(body, tc.key, tc.extra)))
		if err != nil {
			t.Fatalf("%s: %v", tc.key, err)
		}
		w := snap.Warnings()
		if got := len(w) == 1 && strings.Contains(w[0], "request_id: true") && strings.Contains(w[0], "rules.yaml:5"); got != tc.warn {
			t.Errorf("key %q, request_id %v: warnings %q, want one naming request_id: %v", tc.key, tc.extra != "", w, tc.warn)
		}
		if r := snap.Domain("d").Match(entries("user", "u", tc.key, "abc")); r == nil || r.RequestID != (tc.extra != "") {
			t.Errorf("key %q: matched %+v", tc.key, r)
		}
	}
}
