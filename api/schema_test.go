package api

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"gopkg.in/yaml.v3"

	"github.com/ratelimitd/ratelimitd/config"
)

// semanticOnly are bad files whose problem a schema cannot see; the
// parser (and check-config) reports them.
var semanticOnly = map[string]string{
	"duplicate_key.bad.yaml":         "the same descriptor twice at one level",
	"duplicate_key_only.bad.yaml":    "the same key-only descriptor twice at one level",
	"multi_doc.bad.yaml":             "an empty key in the second YAML document, past the one document a schema sees",
	"replaces_self.bad.yaml":         "a limit replacing its own name",
	"rejected_hits_rlqs.bad.yaml":    "a usage budget in a domain with rlqs: a rule's field against the domain's",
	"calendar_rlqs.bad.yaml":         "a calendar period in a domain with rlqs: a rule's field against the domain's",
	"metadata_timestamp.bad.yaml":    "a YAML timestamp in metadata, which a JSON view of the file reads as a string",
	"metadata_large.bad.yaml":        "metadata over 16 KiB as a protobuf Struct: a size the schema does not measure",
	"duplicate_domain_docs.bad.yaml": "one domain in two YAML documents, past the one document a schema sees",
}

func compile(t *testing.T) *jsonschema.Schema {
	t.Helper()
	c := jsonschema.NewCompiler()
	s, err := c.Compile("rules.schema.json")
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// validate converts a YAML file to JSON values and validates it; a file
// that is not even a YAML mapping with string keys is invalid.
func validate(s *jsonschema.Schema, path string) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	var doc any
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return err
	}
	js, err := json.Marshal(doc)
	if err != nil {
		return err
	}
	v, err := jsonschema.UnmarshalJSON(bytes.NewReader(js))
	if err != nil {
		return err
	}
	return s.Validate(v)
}

func TestSchemaAgainstFiles(t *testing.T) {
	s := compile(t)
	good, _ := filepath.Glob("../config/testdata/*.good.yaml")
	examples, _ := filepath.Glob("../deploy/rules/*.yaml")
	good = append(good, examples...)
	if len(good) < 2 {
		t.Fatalf("good files: %v", good)
	}
	for _, f := range good {
		if err := validate(s, f); err != nil {
			t.Errorf("%s: %v", f, err)
		}
	}
	bad, _ := filepath.Glob("../config/testdata/*.bad.yaml")
	for _, f := range bad {
		err := validate(s, f)
		if why, ok := semanticOnly[filepath.Base(f)]; ok {
			if err != nil {
				t.Errorf("%s (%s) is now caught by the schema: drop it from semanticOnly", f, why)
			}
			continue
		}
		if err == nil {
			t.Errorf("%s passes the schema", f)
		}
	}
}

// TestSchemaNamesEveryField keeps the schema and the parser's allow-lists
// in step: at each level the schema has exactly the fields the parser
// accepts (config's lists), and docs/rules.md documents every one.
func TestSchemaNamesEveryField(t *testing.T) {
	raw, err := os.ReadFile("rules.schema.json")
	if err != nil {
		t.Fatal(err)
	}
	var schema map[string]any
	if err := json.Unmarshal(raw, &schema); err != nil {
		t.Fatal(err)
	}
	docs, _ := os.ReadFile("../docs/rules.md")
	at := func(path ...string) map[string]any {
		var v any = schema
		for _, p := range path {
			m, _ := v.(map[string]any)
			v = m[p]
		}
		m, _ := v.(map[string]any)
		return m
	}
	for _, level := range []struct {
		name   string
		props  map[string]any
		fields []string
	}{
		{"domain", at("properties"), config.DomainFields},
		{"rlqs", at("properties", "rlqs", "properties"), config.RLQSFields},
		{"descriptor", at("$defs", "descriptor", "properties"), config.DescriptorFields},
		{"rate_limit", at("$defs", "rate_limit", "properties"), config.RateLimitFields},
		{"replaces", at("$defs", "rate_limit", "properties", "replaces", "items", "properties"), config.ReplacesFields},
	} {
		for _, f := range level.fields {
			if _, ok := level.props[f]; !ok {
				t.Errorf("schema: %s lacks %q, which the parser accepts", level.name, f)
			}
			if !strings.Contains(string(docs), f+":") {
				t.Errorf("docs/rules.md lacks %q", f)
			}
		}
		for f := range level.props {
			if !slices.Contains(level.fields, f) {
				t.Errorf("schema: %s has %q, which the parser refuses", level.name, f)
			}
		}
	}
}
