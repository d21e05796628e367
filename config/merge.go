package config

import (
	"fmt"
	"slices"
)

// merge adds o's top-level descriptors to d, a domain of the same name
// from another file (Options.MergeDomains), and returns a problem for
// each descriptor both define. Lookups stay as in one file: an exact
// value, then wildcards in load order (d's first), then the key-only
// rule.
func (d *Domain) merge(o *Domain) []error {
	var errs []error
	switch {
	case o.RLQSKeys == nil:
	case d.RLQSKeys == nil:
		d.RLQSKeys = o.RLQSKeys
	case !slices.Equal(d.RLQSKeys, o.RLQSKeys):
		errs = append(errs, &Error{File: o.File, Path: "rlqs.descriptor_keys",
			Msg: fmt.Sprintf("differs from the domain's rlqs.descriptor_keys in %s", d.File)})
	}
	if o.root == nil {
		return errs
	}
	if d.root == nil {
		d.root = &level{byKey: map[string]*keyRules{}}
	}
	dup := func(r, prev *Rule) {
		errs = append(errs, &Error{File: r.File, Line: r.Line, Path: r.Path,
			Msg: fmt.Sprintf("duplicate descriptor across merged files (also defined at %s:%d)", prev.File, prev.Line)})
	}
	keys := make([]string, 0, len(o.root.byKey))
	for k := range o.root.byKey {
		keys = append(keys, k)
	}
	slices.Sort(keys) // the problems in a stable order
	for _, k := range keys {
		okr := o.root.byKey[k]
		kr := d.root.byKey[k]
		if kr == nil {
			d.root.byKey[k] = okr
			continue
		}
		if okr.def != nil {
			if kr.def != nil {
				dup(okr.def, kr.def)
			} else {
				kr.def = okr.def
			}
		}
		values := make([]string, 0, len(okr.exact))
		for v := range okr.exact {
			values = append(values, v)
		}
		slices.Sort(values)
		for _, v := range values {
			if prev := kr.exact[v]; prev != nil {
				dup(okr.exact[v], prev)
				continue
			}
			kr.exact[v] = okr.exact[v]
		}
		for _, w := range okr.wildcards {
			if i := slices.IndexFunc(kr.wildcards, func(p *Rule) bool { return p.Value == w.Value }); i >= 0 {
				dup(w, kr.wildcards[i])
				continue
			}
			kr.wildcards = append(kr.wildcards, w)
		}
	}
	d.rules = append(d.rules, o.rules...)
	return errs
}
