package config

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	"gopkg.in/yaml.v3"
)

// Error is one problem in a rules file.
type Error struct {
	File string
	Line int
	// Path is where in the document the problem is, e.g.
	// "descriptors[0].rate_limit.unit".
	Path string
	Msg  string
}

func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString(e.File)
	if e.Line > 0 {
		fmt.Fprintf(&b, ":%d", e.Line)
	}
	b.WriteString(": ")
	if e.Path != "" {
		b.WriteString(e.Path)
		b.WriteString(": ")
	}
	b.WriteString(e.Msg)
	return b.String()
}

// parser collects every problem of one file (the first maxErrors of them)
// within the bounds of limits.go.
type parser struct {
	ctx       context.Context
	file      string
	errs      []error
	dropped   int // problems beyond maxErrors
	rules     int
	walked    int // nodes walked, aliases expanded
	checked   int // walked when ctx was last checked
	pathBytes int
	stopped   bool
	noLines   bool // the document was rendered: its lines mean nothing
}

// deref resolves a YAML alias to the node it names.
func deref(n *yaml.Node) *yaml.Node {
	for i := 0; n != nil && n.Kind == yaml.AliasNode && n.Alias != nil && i < 16; i++ {
		n = n.Alias
	}
	return n
}

func (p *parser) errorf(n *yaml.Node, path, format string, args ...any) {
	if len(p.errs) >= maxErrors {
		p.dropped++
		return
	}
	p.errs = append(p.errs, &Error{File: p.file, Line: p.line(n), Path: Truncate(path, maxErrorText),
		Msg: Truncate(fmt.Sprintf(format, args...), maxErrorText)})
}

// line is n's line for errors and rules: 0 when unknown or meaningless.
func (p *parser) line(n *yaml.Node) int {
	if n == nil || p.noLines {
		return 0
	}
	return n.Line
}

// err returns every problem recorded, or nil.
func (p *parser) err() error {
	if len(p.errs) == 0 {
		return nil
	}
	if p.dropped > 0 {
		p.errs = append(p.errs, &Error{File: p.file, Msg: fmt.Sprintf("%d more problems not shown", p.dropped)})
	}
	return errors.Join(p.errs...)
}

// parseDoc parses a rules file into its uncompiled domains, one for each
// YAML document ('---' separates them, as generators write several
// RateLimitConfigs to one file), within the bounds of limits.go, which
// hold for the file as a whole; it stops early when ctx is done.
func parseDoc(ctx context.Context, in Doc) ([]*Domain, error) {
	file, data := in.Name, in.Data
	p := &parser{ctx: ctx, file: file, noLines: !in.Lines}
	if n := estimateNodes(data); n > MaxYAMLNodes {
		return nil, &Error{File: file, Msg: fmt.Sprintf("too large: up to %d YAML nodes, more than the %d allowed", n, MaxYAMLNodes)}
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var domains []*Domain
	for !p.stopped {
		var doc yaml.Node
		err := dec.Decode(&doc)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			line, msg := yamlError(data, err)
			if p.noLines {
				line = 0
			}
			return nil, &Error{File: file, Line: line, Msg: "invalid YAML: " + strings.TrimPrefix(msg, "yaml: ")}
		}
		root := &doc
		if root.Kind == yaml.DocumentNode && len(root.Content) == 1 {
			root = root.Content[0]
		}
		if root.Kind == yaml.DocumentNode || root.Kind == yaml.ScalarNode && root.Tag == "!!null" {
			continue // an empty document: a leading or trailing '---'
		}
		if d := p.domain(root); d != nil {
			domains = append(domains, d)
		}
	}
	if err := p.err(); err != nil {
		return nil, err
	}
	if len(domains) == 0 {
		return nil, &Error{File: file, Msg: "empty file: a rules file needs a domain"}
	}
	return domains, nil
}

// fields checks that n is a mapping with unique, known, string keys and
// returns the values by key.
// The fields a rules document may have at each level, and nothing else:
// the parser refuses any other, and api/rules.schema.json is held to
// exactly these by its test.
var (
	DomainFields     = []string{"domain", "descriptors", "name", "rlqs"}
	RLQSFields       = []string{"descriptor_keys"}
	DescriptorFields = []string{"key", "value", "rate_limit", "descriptors", "shadow_mode", "quota_mode", "detailed_metric",
		"value_to_metric", "share_threshold", "metadata", "failure_mode", "request_id"}
	RateLimitFields = []string{"unit", "requests_per_unit", "unlimited", "name", "replaces", "algorithm", "burst", "global",
		"unit_multiplier", "lease", "rejected_hits", "calendar"}
	ReplacesFields = []string{"name"}
)

func (p *parser) fields(n *yaml.Node, path string, known ...string) map[string]*yaml.Node {
	if n.Kind == yaml.ScalarNode && n.Tag == "!!null" {
		return map[string]*yaml.Node{}
	}
	if n.Kind != yaml.MappingNode {
		p.errorf(n, path, "want a mapping, got %s", kindName(n))
		return nil
	}
	if !p.charge(1 + len(n.Content)) {
		return nil
	}
	out := make(map[string]*yaml.Node, min(len(n.Content)/2, len(known)))
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], deref(n.Content[i+1])
		if k.Kind != yaml.ScalarNode || k.Tag != "!!str" {
			p.errorf(k, path, "key %q is not a string", Truncate(k.Value, 64))
			continue
		}
		if _, dup := out[k.Value]; dup {
			p.errorf(k, path, "duplicate field %q", Truncate(k.Value, 64))
			continue
		}
		ok := false
		for _, name := range known {
			if name == k.Value {
				ok = true
				break
			}
		}
		if !ok {
			p.errorf(k, path, "unknown field %q (known: %s)", Truncate(k.Value, 64), strings.Join(known, ", "))
			continue
		}
		out[k.Value] = v
	}
	return out
}

func (p *parser) domain(n *yaml.Node) *Domain {
	// name is a RateLimitConfig's own name, which generators write out;
	// the domain is what identifies the rules.
	f := p.fields(n, "", DomainFields...)
	if f == nil {
		return nil
	}
	d := &Domain{File: p.file}
	if v, ok := f["rlqs"]; ok {
		d.RLQSKeys = p.rlqs(v)
	}
	if v, ok := f["name"]; ok {
		d.ConfigName, _ = p.str(v, "name")
	}
	if v, ok := f["domain"]; ok {
		d.Name, _ = p.str(v, "domain")
		d.Line = v.Line
	}
	if d.Name == "" {
		p.errorf(n, "domain", "missing or empty domain")
	}
	d.root = p.descriptors(f["descriptors"], "descriptors", d, nil)
	if d.RLQSKeys != nil {
		for _, r := range d.rules {
			if r.Limit != nil && r.Limit.Calendar {
				// RLQS grants count windows of fixed length.
				p.errorf(f["rlqs"], "rlqs", "rule %s sets calendar: true, and RLQS grants count windows of fixed length: drop calendar, or rlqs from this domain", r.Path)
			}
			if r.Limit != nil && r.Limit.RejectedHits == RejectedUsage {
				// An RLQS bucket spends granted requests, one per call; a
				// usage charge has no way in, so the budget would not hold.
				p.errorf(f["rlqs"], "rlqs", "rule %s sets rejected_hits: usage, and RLQS buckets count requests, not usage: serve the budget over ShouldRateLimit, or drop rlqs from this domain", r.Path)
			}
		}
	}
	return d
}

// MaxRLQSKeys bounds rlqs.descriptor_keys: a bucket's descriptor has at
// most this many entries, the default bound of a request's descriptor.
const MaxRLQSKeys = 32

// rlqs reads a domain's `rlqs: {descriptor_keys: [k1, k2, ...]}`: the
// bucket id keys that make an RLQS bucket's descriptor, in order.
func (p *parser) rlqs(n *yaml.Node) []string {
	f := p.fields(n, "rlqs", RLQSFields...)
	if f == nil {
		return nil
	}
	v, ok := f["descriptor_keys"]
	if !ok {
		p.errorf(n, "rlqs.descriptor_keys", "missing descriptor_keys (the bucket id keys, in descriptor order)")
		return nil
	}
	if v.Kind != yaml.SequenceNode || len(v.Content) == 0 {
		p.errorf(v, "rlqs.descriptor_keys", "want a non-empty list of keys, got %s", kindName(v))
		return nil
	}
	if len(v.Content) > MaxRLQSKeys {
		p.errorf(v, "rlqs.descriptor_keys", "%d keys, more than the %d allowed", len(v.Content), MaxRLQSKeys)
		return nil
	}
	if !p.charge(1 + len(v.Content)) {
		return nil
	}
	keys := make([]string, 0, len(v.Content))
	for i, c := range v.Content {
		path := fmt.Sprintf("rlqs.descriptor_keys[%d]", i)
		k, ok := p.str(deref(c), path)
		switch {
		case !ok:
		case k == "":
			p.errorf(c, path, "empty key")
		case len(k) > MaxValueBytes:
			p.errorf(c, path, "%d bytes, more than the %d allowed", len(k), MaxValueBytes)
		case slices.Contains(keys, k):
			p.errorf(c, path, "duplicate key %q", Truncate(k, 64))
		default:
			keys = append(keys, k)
		}
	}
	return keys
}

func (p *parser) descriptors(n *yaml.Node, path string, d *Domain, parent *Rule) *level {
	if n == nil || (n.Kind == yaml.ScalarNode && n.Tag == "!!null") {
		return nil
	}
	if n.Kind != yaml.SequenceNode {
		p.errorf(n, path, "want a list of descriptors, got %s", kindName(n))
		return nil
	}
	lv := &level{byKey: map[string]*keyRules{}}
	if parent != nil && parent.depth >= MaxDepth {
		p.errorf(n, path, "descriptors nested more than %d levels deep", MaxDepth)
		return lv
	}
	if !p.charge(1 + len(n.Content)) {
		return lv
	}
	for i, c := range n.Content {
		if p.stopped {
			return lv
		}
		c = deref(c)
		cp := fmt.Sprintf("%s[%d]", path, i)
		p.rules++
		if p.rules > MaxRules {
			p.stop(fmt.Sprintf("more than %d descriptors in one file (aliases expanded)", MaxRules))
			return lv
		}
		r := p.rule(c, cp, d, parent)
		if r == nil {
			continue
		}
		kr := lv.byKey[r.Key]
		if kr == nil {
			kr = &keyRules{exact: map[string]*Rule{}}
			lv.byKey[r.Key] = kr
		}
		var prev *Rule
		switch {
		case r.Value == "":
			prev, kr.def = kr.def, r
		case r.wildcard != nil:
			for _, w := range kr.wildcards {
				if w.Value == r.Value {
					prev = w
				}
			}
			if prev == nil {
				kr.wildcards = append(kr.wildcards, r)
			}
		default:
			prev = kr.exact[r.Value]
			kr.exact[r.Value] = r
		}
		if prev != nil {
			p.errorf(c, cp, "duplicate descriptor %s (first defined at line %d)", r.Path, prev.Line)
		}
	}
	return lv
}

// rule parses one descriptor rule of domain d under parent (nil at the
// top) and its children; nil when it cannot be kept.
func (p *parser) rule(n *yaml.Node, path string, d *Domain, parent *Rule) *Rule {
	f := p.fields(n, path, DescriptorFields...)
	if f == nil {
		return nil
	}
	r := &Rule{File: p.file, Line: p.line(n), parent: parent, depth: 1}
	if parent != nil {
		r.depth = parent.depth + 1
	}
	if !p.ruleKey(n, f, path, r) || !p.rulePath(d, parent, r) {
		return nil
	}
	p.ruleFlags(f, path, r)
	if v, ok := f["failure_mode"]; ok {
		if s, ok := p.str(v, path+".failure_mode"); ok {
			fm, err := ParseFailureMode(s)
			if err != nil {
				p.errorf(v, path+".failure_mode", "%v", err)
			}
			r.FailureMode = fm
		}
	}
	if v, ok := f["metadata"]; ok {
		r.Metadata = p.ruleMetadata(v, path+".metadata")
	}
	// rate_limit: null is no limit, as a RateLimitConfig without a
	// policy means (generators write it out).
	if v, ok := f["rate_limit"]; ok && !(v.Kind == yaml.ScalarNode && v.Tag == "!!null") {
		r.Limit = p.rateLimit(v, path+".rate_limit")
	}
	d.rules = append(d.rules, r)
	r.children = p.descriptors(f["descriptors"], path+".descriptors", d, r)
	return r
}

// ruleKey reads r's key and value (and its wildcard); false for one too
// long to keep.
func (p *parser) ruleKey(n *yaml.Node, f map[string]*yaml.Node, path string, r *Rule) bool {
	if v, ok := f["key"]; ok {
		r.Key, _ = p.str(v, path+".key")
	}
	if r.Key == "" {
		p.errorf(n, path+".key", "missing or empty key")
	}
	if v, ok := f["value"]; ok {
		r.Value, _ = p.str(v, path+".value")
	}
	for _, kv := range [...]struct{ name, s string }{{"key", r.Key}, {"value", r.Value}} {
		if len(kv.s) > MaxValueBytes {
			p.errorf(f[kv.name], path+"."+kv.name, "%d bytes, more than the %d allowed", len(kv.s), MaxValueBytes)
			return false
		}
	}
	if strings.Contains(r.Value, "*") {
		r.wildcard = strings.Split(r.Value, "*")
	}
	return true
}

// rulePath names r by its domain's and ancestors' segments; false once
// the paths add up past their bound (the parse stops).
func (p *parser) rulePath(d *Domain, parent *Rule, r *Rule) bool {
	seg := PathSegment(r.Key, r.Value)
	if parent != nil {
		r.Path = parent.Path + "." + seg
	} else {
		r.Path = d.Name + "." + seg
	}
	if p.pathBytes += len(r.Path); p.pathBytes > MaxPathBytes {
		p.stop(fmt.Sprintf("descriptor paths add up to more than %d bytes (long keys nested deep, or aliases)", MaxPathBytes))
		return false
	}
	return true
}

// ruleFlags reads r's booleans, and refuses those its key and value
// cannot carry.
func (p *parser) ruleFlags(f map[string]*yaml.Node, path string, r *Rule) {
	r.ShadowMode = p.boolean(f["shadow_mode"], path+".shadow_mode")
	r.QuotaMode = p.boolean(f["quota_mode"], path+".quota_mode")
	r.DetailedMetric = p.boolean(f["detailed_metric"], path+".detailed_metric")
	r.ValueToMetric = p.boolean(f["value_to_metric"], path+".value_to_metric")
	r.ShareThreshold = p.boolean(f["share_threshold"], path+".share_threshold")
	if r.ShareThreshold && r.wildcard == nil {
		p.errorf(f["share_threshold"], path+".share_threshold", "share_threshold needs a wildcard value (containing '*'), got %q", r.Value)
	}
	r.RequestID = p.boolean(f["request_id"], path+".request_id")
	if r.RequestID && (r.Value != "" || f["rate_limit"] == nil) {
		p.errorf(f["request_id"], path+".request_id", "request_id needs a key-only level that holds the rate_limit: its value is each request's id, the last entry of the descriptor")
	}
}

// ruleMetadata is a rule's metadata as the protobuf Struct a response
// carries; nil when it cannot be one.
func (p *parser) ruleMetadata(v *yaml.Node, path string) *structpb.Struct {
	m := p.metadata(v, path)
	if m == nil {
		return nil
	}
	st, err := structpb.NewStruct(m)
	switch {
	case err != nil:
		p.errorf(v, path, "cannot be returned as a protobuf Struct in a response's dynamic metadata: %v", err)
	case proto.Size(st) > MaxMetadataBytes:
		p.errorf(v, path, "%d bytes as a protobuf Struct, more than the %d a response may carry", proto.Size(st), MaxMetadataBytes)
	default:
		return st
	}
	return nil
}
