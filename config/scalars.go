package config

import (
	"math"
	"strconv"
	"strings"

	"gopkg.in/yaml.v3"
)

// str reads a scalar as a string. Integers and booleans keep their source
// text, as envoyproxy/ratelimit coerces them.
func (p *parser) str(n *yaml.Node, path string) (string, bool) {
	if n.Kind != yaml.ScalarNode {
		p.errorf(n, path, "want a string, got %s", kindName(n))
		return "", false
	}
	switch n.Tag {
	case "!!str", "!!int", "!!bool":
		return n.Value, true
	case "!!null":
		return "", true
	}
	p.errorf(n, path, "want a string, got %s %q (quote it)", kindName(n), Truncate(n.Value, 64))
	return "", false
}

func (p *parser) boolean(n *yaml.Node, path string) bool {
	if n == nil {
		return false
	}
	if n.Kind != yaml.ScalarNode || n.Tag != "!!bool" {
		p.errorf(n, path, "want true or false, got %s %q", kindName(n), Truncate(n.Value, 64))
		return false
	}
	b, _ := strconv.ParseBool(strings.ToLower(n.Value))
	return b
}

// uint32 reads a whole number from least to 2^32-1; out of range (or not
// a whole number) it says so once, and returns 0.
func (p *parser) uint32(n *yaml.Node, path string, least uint32) uint32 {
	return uint32(p.uint64In(n, path, uint64(least), math.MaxUint32))
}

func (p *parser) uint64(n *yaml.Node, path string, most uint64) uint64 {
	return p.uint64In(n, path, 0, most)
}

// uint64In reads a whole number from least to most; out of range (or
// not a whole number) it says so once, naming the range, and returns 0.
func (p *parser) uint64In(n *yaml.Node, path string, least, most uint64) uint64 {
	digits := strings.TrimLeft(n.Value, "+-") != "" && strings.Trim(strings.TrimLeft(n.Value, "+-"), "0123456789") == ""
	if n.Kind != yaml.ScalarNode || n.Tag != "!!int" && !digits {
		p.errorf(n, path, "want a whole number, got %s %q", kindName(n), Truncate(n.Value, 64))
		return 0
	}
	// A number of digits too long for 64 bits is read as a float by
	// YAML: it is out of range, not a float.
	v, err := strconv.ParseUint(n.Value, 0, 64)
	if err != nil || v < least || v > most {
		p.errorf(n, path, "%s is out of range (%d to %d)", Truncate(n.Value, 64), least, most)
		return 0
	}
	return v
}

func kindName(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.AliasNode:
		return "an alias"
	case yaml.ScalarNode:
		return strings.TrimPrefix(n.Tag, "!!")
	}
	return "unknown node"
}
