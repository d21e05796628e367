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

func (p *parser) uint32(n *yaml.Node, path string) uint32 {
	if n.Kind != yaml.ScalarNode || n.Tag != "!!int" {
		p.errorf(n, path, "want a whole number, got %s %q", kindName(n), Truncate(n.Value, 64))
		return 0
	}
	v, err := strconv.ParseInt(n.Value, 0, 64)
	if err != nil || v < 0 || v > math.MaxUint32 {
		p.errorf(n, path, "%s is out of range (0 to %d)", Truncate(n.Value, 64), uint32(math.MaxUint32))
		return 0
	}
	return uint32(v)
}

func (p *parser) uint64(n *yaml.Node, path string, most uint64) uint64 {
	if n.Kind != yaml.ScalarNode || n.Tag != "!!int" {
		p.errorf(n, path, "want a whole number, got %s %q", kindName(n), Truncate(n.Value, 64))
		return 0
	}
	v, err := strconv.ParseUint(n.Value, 0, 64)
	if err != nil || v > most {
		p.errorf(n, path, "%s is out of range (0 to %d)", Truncate(n.Value, 64), most)
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
