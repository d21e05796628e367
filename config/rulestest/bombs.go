// Package rulestest builds rules files for tests: hostile ones that the
// rules parser must refuse quickly and in bounded memory.
package rulestest

import (
	"fmt"
	"strings"
)

// Bombs returns rules files made to exhaust a parser, by name, each as an
// attacker (or a careless generator) would write it: config's tests load
// them, cmd's offer them to a running server by hot reload.
func Bombs() map[string][]byte {
	var b strings.Builder
	meta := func(n int) []byte {
		b.Reset()
		b.WriteString("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n    metadata:\n")
		for i := range n {
			fmt.Fprintf(&b, "      k%d: %d\n", i, i)
		}
		return []byte(b.String())
	}
	out := map[string][]byte{
		"metadata_40k":  meta(40_000),
		"metadata_160k": meta(160_000),
	}
	// Aliases of aliases inside metadata: 10^8 values from a few lines.
	b.Reset()
	b.WriteString("domain: d\ndescriptors:\n  - key: k\n    metadata:\n      a0: &a0 {")
	for i := range 100 {
		fmt.Fprintf(&b, "x%d: %d, ", i, i)
	}
	b.WriteString("y: 0}\n")
	for l := 1; l < 9; l++ {
		fmt.Fprintf(&b, "      a%d: &a%d [%s]\n", l, l, strings.TrimSuffix(strings.Repeat(fmt.Sprintf("*a%d, ", l-1), 10), ", "))
	}
	out["metadata_alias"] = []byte(b.String())
	// Aliases of aliases of descriptors: 10^8 rules.
	b.Reset()
	b.WriteString("domain: d\ndescriptors:\n  - &l0 {key: a0, value: v, rate_limit: {unit: second, requests_per_unit: 1}}\n")
	for l := 1; l < 9; l++ {
		fmt.Fprintf(&b, "  - &l%d {key: a%d, descriptors: [%s]}\n", l, l, strings.TrimSuffix(strings.Repeat(fmt.Sprintf("*l%d, ", l-1), 10), ", "))
	}
	out["descriptor_alias"] = []byte(b.String())
	// One descriptor with a long key, aliased thousands of times: every
	// alias copied the key into its path and its error (114 KB: 1.2 GB).
	long := strings.Repeat("K", 100_000)
	out["path_long_key"] = []byte("domain: d\ndescriptors:\n  - &d {key: " + long + ", rate_limit: {unit: second, requests_per_unit: 1}}\n" +
		"  - {key: x, descriptors: [" + strings.TrimSuffix(strings.Repeat("*d, ", 3500), ", ") + "]}\n")
	// Keys within the bound, nested under aliases: paths grow with depth.
	b.Reset()
	k := strings.Repeat("K", 4000)
	b.WriteString("domain: d\ndescriptors:\n  - &l0 {key: " + k + "0, rate_limit: {unit: second, requests_per_unit: 1}}\n")
	for l := 1; l < 6; l++ {
		fmt.Fprintf(&b, "  - &l%d {key: %s%d, descriptors: [%s]}\n", l, k, l, strings.TrimSuffix(strings.Repeat(fmt.Sprintf("*l%d, ", l-1), 10), ", "))
	}
	out["path_deep"] = []byte(b.String())
	// A valid subtree of 300 limits aliased under 5000 keys.
	b.Reset()
	b.WriteString("domain: d\ndescriptors:\n  - key: base\n    descriptors: &sub\n")
	for i := range 300 {
		fmt.Fprintf(&b, "      - {key: s%d, rate_limit: {unit: second, requests_per_unit: 1}}\n", i)
	}
	for i := range 5000 {
		fmt.Fprintf(&b, "  - {key: c%d, descriptors: *sub}\n", i)
	}
	out["walk_alias"] = []byte(b.String())
	// Four megabytes of a flow list: millions of nodes.
	out["flow_nodes"] = []byte("domain: d\ndescriptors:\n  - key: k\n    metadata: {x: [" + strings.Repeat("1,", 1_900_000) + "1]}\n")
	return out
}
