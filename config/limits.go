package config

import (
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"

	"gopkg.in/yaml.v3"
)

// Bounds on one rules file. A rules file is input from whoever can write
// to the rules directory (or a ConfigMap); whatever it holds, parsing it
// must end quickly in bounded memory, so that a bad file is refused and the
// rules in force stay. YAML aliases are the danger: a few bytes can name a
// subtree thousands of times, and every use is walked (and, for a
// descriptor, turned into a rule with its own path) as if written out.
const (
	// MaxFileSize bounds one rules file; a larger file is refused rather
	// than read into memory.
	MaxFileSize = 4 << 20
	// MaxYAMLNodes bounds the YAML nodes a file may hold, estimated from
	// its indicator characters before the YAML library builds its tree
	// (about 200 bytes a node): the tree of the largest file allowed stays
	// near 100 MB.
	MaxYAMLNodes = 500_000
	// MaxWalkNodes bounds the nodes the parser walks, every alias expanded
	// where it is used: beyond it the file is refused for excessive
	// aliasing, as envoyproxy/ratelimit's YAML decoder refuses such files.
	MaxWalkNodes = 1_000_000
	// MaxRules bounds the descriptors of one file, aliases expanded.
	MaxRules = 100_000
	// MaxDepth bounds the nesting of descriptors (a request has at most 32
	// entries by default, so deeper rules could not match anyway).
	MaxDepth = 64
	// MaxValueBytes bounds a descriptor's key and value, and a limit's
	// name (requests carry at most 4096 bytes per entry by default).
	MaxValueBytes = 4096
	// MaxPathBytes bounds the descriptor paths of one file added up: every
	// rule keeps its path (for metrics and errors), and deep nesting of
	// long keys under aliases would otherwise multiply them.
	MaxPathBytes = 16 << 20
	// MaxMetadataNodes bounds one rule's metadata, aliases expanded.
	MaxMetadataNodes = 10_000
	// MaxMetadataBytes bounds one rule's metadata as the protobuf Struct
	// a response returns: several merged into one answer stay far below
	// Envoy's and gRPC's message bounds.
	MaxMetadataBytes = 16 << 10
	// maxErrors bounds the problems reported per file; the rest are
	// counted.
	maxErrors = 50
	// maxErrorText bounds the path and the message of one problem.
	maxErrorText = 512
)

// estimateNodes is an upper bound of the YAML nodes in data, without
// parsing it. Apart from the document's root, every node is a sequence
// item, which follows a '-', a '[' or a ',', or a mapping key or value: a
// key and its value follow a ':', a '?', a '{' or a ',' (a key with no ':'
// has an implicit null value). Anchors and tags add no node; indicators
// inside strings only raise the bound.
func estimateNodes(data []byte) int {
	items, pairs := 0, 0
	for _, c := range data {
		switch c {
		case '-', '[':
			items++
		case ':', '?', '{', ',':
			pairs++
		}
	}
	return 1 + items + 2*pairs
}

// charge counts n walked nodes. It reports false, and stops the parse,
// beyond the budget or once ctx is done: every loop of the parser checks
// it, so a stopped parse unwinds without walking further.
func (p *parser) charge(n int) bool {
	if p.stopped {
		return false
	}
	p.walked += n
	if p.walked > MaxWalkNodes {
		p.stop(fmt.Sprintf("excessive aliasing: the file expands to more than %d YAML nodes", MaxWalkNodes))
		return false
	}
	if p.walked-p.checked >= 4096 {
		p.checked = p.walked
		if err := p.ctx.Err(); err != nil {
			p.stop("parse stopped: " + err.Error())
			return false
		}
	}
	return true
}

// stop ends the parse with one last problem.
func (p *parser) stop(msg string) {
	p.stopped = true
	p.errs = append(p.errs, &Error{File: p.file, Msg: msg})
}

// Truncate bounds s to max bytes, cut at a rune boundary and marked with
// the length it had.
func Truncate(s string, max int) string {
	if len(s) <= max {
		return s
	}
	cut := max
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return fmt.Sprintf("%s…(%d bytes)", s[:cut], len(s))
}

// metadata turns a metadata node into plain Go values in linear time
// (yaml.v3's own decoding checks keys for duplicates pairwise: 40,000 keys
// took seconds, 160,000 minutes), charging every node, aliases expanded.
func (p *parser) metadata(n *yaml.Node, path string) map[string]any {
	budget := MaxMetadataNodes
	var conv func(n *yaml.Node, depth int) (any, error)
	conv = func(n *yaml.Node, depth int) (any, error) {
		n = deref(n)
		if !p.charge(1) {
			return nil, errStopped
		}
		if budget--; budget < 0 {
			return nil, fmt.Errorf("more than %d YAML nodes (aliases expanded)", MaxMetadataNodes)
		}
		if depth > MaxDepth {
			return nil, fmt.Errorf("nested more than %d levels deep", MaxDepth)
		}
		switch n.Kind {
		case yaml.MappingNode:
			m := make(map[string]any, len(n.Content)/2)
			for i := 0; i+1 < len(n.Content); i += 2 {
				k := deref(n.Content[i])
				if k.Kind != yaml.ScalarNode {
					return nil, fmt.Errorf("line %d: a key is %s, want a scalar", k.Line, kindName(k))
				}
				if _, dup := m[k.Value]; dup {
					return nil, fmt.Errorf("line %d: duplicate key %q", k.Line, Truncate(k.Value, 64))
				}
				v, err := conv(n.Content[i+1], depth+1)
				if err != nil {
					return nil, err
				}
				m[k.Value] = v
			}
			return m, nil
		case yaml.SequenceNode:
			s := make([]any, 0, len(n.Content))
			for _, c := range n.Content {
				v, err := conv(c, depth+1)
				if err != nil {
					return nil, err
				}
				s = append(s, v)
			}
			return s, nil
		case yaml.ScalarNode:
			var v any
			if err := n.Decode(&v); err != nil {
				return nil, fmt.Errorf("line %d: %v", n.Line, strings.TrimPrefix(err.Error(), "yaml: "))
			}
			return v, nil
		}
		return nil, fmt.Errorf("line %d: unexpected %s", n.Line, kindName(n))
	}
	if n.Kind != yaml.MappingNode {
		p.errorf(n, path, "want a mapping, got %s", kindName(n))
		return nil
	}
	v, err := conv(n, 0)
	if err == errStopped {
		return nil
	}
	if err != nil {
		p.errorf(n, path, "%v", err)
		return nil
	}
	return v.(map[string]any)
}

// errStopped unwinds a metadata conversion once the parse has stopped
// (the problem is recorded already).
var errStopped = errors.New("stopped")
