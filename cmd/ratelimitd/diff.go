package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/ratelimitd/ratelimitd/config"
)

// diffRules prints what a rules change does, rule by rule: what a
// reviewer needs to know of a pull request to the rules, which a YAML
// diff shows only as moved lines.
func diffRules(_ context.Context, args []string, out io.Writer) error {
	const cmd = "ratelimitd diff"
	fs := flag.NewFlagSet(cmd, flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "Usage: ratelimitd diff OLD NEW\n\nPrints what changing the rules OLD to NEW (files or directories) does,\nrule by rule: limits, keys that start afresh, rules added and removed.\nExits 0 when nothing limited changes, 1 when something does, 2 when\nthe rules cannot be read (as diff(1)).")
	}
	if err := parseFlags(fs, cmd, args, out); err != nil {
		return helpIsDone(err)
	}
	if fs.NArg() != 2 {
		return usagef(cmd, "want two rules paths, the old and the new; got %d", fs.NArg())
	}
	before, err := config.Load(fs.Arg(0))
	if err != nil {
		return &exitError{code: 2, err: fmt.Errorf("diff: old rules: %w", err)}
	}
	after, err := config.Load(fs.Arg(1))
	if err != nil {
		return &exitError{code: 2, err: fmt.Errorf("diff: new rules: %w", err)}
	}
	lines := ruleChanges(before, after)
	if len(lines) == 0 {
		fmt.Fprintln(out, "no change in what is limited")
		return nil
	}
	for _, l := range lines {
		fmt.Fprintln(out, l)
	}
	return &exitError{code: 1} // as diff(1): the rules differ
}

// ruleChanges lists the changes from before to after, domain by domain,
// rule by rule (by path), in a stable order.
func ruleChanges(before, after *config.Snapshot) []string {
	var out []string
	domains := append(before.Domains(), after.Domains()...)
	slices.Sort(domains)
	domains = slices.Compact(domains)
	for _, name := range domains {
		b, a := before.Domain(name), after.Domain(name)
		switch {
		case b == nil:
			out = append(out, fmt.Sprintf("+ domain %s (%s): new", name, a.File))
		case a == nil:
			out = append(out, fmt.Sprintf("- domain %s (%s): removed; its requests are no longer limited", name, b.File))
			continue
		}
		old := map[string]*config.Rule{}
		if b != nil {
			for _, r := range b.Rules() {
				old[r.Path] = r
			}
		}
		seen := map[string]bool{}
		for _, r := range a.Rules() {
			seen[r.Path] = true
			o := old[r.Path]
			if o == nil {
				out = append(out, fmt.Sprintf("+ %s (%s:%d): %s", r.Path, r.File, r.Line, limitSummary(r)))
				continue
			}
			if ch := changes(o, r); len(ch) > 0 {
				out = append(out, fmt.Sprintf("~ %s (%s:%d): %s", r.Path, r.File, r.Line, strings.Join(ch, "; ")))
			}
		}
		if b != nil {
			for _, r := range b.Rules() {
				if !seen[r.Path] {
					out = append(out, fmt.Sprintf("- %s (was %s:%d): %s; removed", r.Path, r.File, r.Line, limitSummary(r)))
				}
			}
		}
	}
	return out
}

// limitSummary says in a few words what a rule does.
func limitSummary(r *config.Rule) string {
	l := r.Limit
	var s string
	switch {
	case l == nil:
		s = "no rate_limit"
	case l.Unlimited:
		s = "unlimited"
	default:
		per := l.Unit.String()
		if l.UnitMultiplier > 1 {
			per = fmt.Sprintf("%d %ss", l.UnitMultiplier, l.Unit)
		}
		s = fmt.Sprintf("%d per %s, %s", l.RequestsPerUnit, per, l.Algorithm)
		if l.Burst > 0 {
			s += fmt.Sprintf(" burst %d", l.Burst)
		}
		if l.Lease {
			s += ", leased"
		}
	}
	if r.ShadowMode {
		s += ", shadow mode"
	}
	if r.QuotaMode {
		s += ", quota mode"
	}
	return s
}

// changes lists what differs between two versions of one rule, and says
// when its counters start afresh: the counter key holds the window and
// the algorithm, and share_threshold changes which values share one.
func changes(o, r *config.Rule) []string {
	var d diffs
	ol, rl := o.Limit, r.Limit
	switch {
	case ol == nil && rl != nil:
		d.note("now limited: " + limitSummary(r))
	case ol != nil && rl == nil:
		d.note("no longer limited (was " + limitSummary(o) + ")")
	case ol != nil && rl != nil:
		d.limit(ol, rl)
	}
	d.add("shadow_mode", o.ShadowMode, r.ShadowMode)
	d.add("quota_mode", o.QuotaMode, r.QuotaMode)
	d.add("failure_mode", o.FailureMode, r.FailureMode)
	d.add("detailed_metric", o.DetailedMetric, r.DetailedMetric)
	if o.ShareThreshold != r.ShareThreshold {
		d.note(fmt.Sprintf("share_threshold %v -> %v: its counters start afresh", o.ShareThreshold, r.ShareThreshold))
	}
	return d
}

// diffs are the changes to one rule, in the order found.
type diffs []string

func (d *diffs) note(s string) { *d = append(*d, s) }

// add notes a field whose value changed.
func (d *diffs) add(what string, from, to any) {
	if from != to {
		d.note(fmt.Sprintf("%s %v -> %v", what, from, to))
	}
}

// limit notes what changed between two limits.
func (d *diffs) limit(ol, rl *config.RateLimit) {
	if ol.RequestsPerUnit != rl.RequestsPerUnit && !ol.Unlimited && !rl.Unlimited {
		dir := "raised"
		if rl.RequestsPerUnit < ol.RequestsPerUnit {
			dir = "lowered"
		}
		d.note(fmt.Sprintf("requests_per_unit %d -> %d (%s)", ol.RequestsPerUnit, rl.RequestsPerUnit, dir))
	}
	d.add("unlimited", ol.Unlimited, rl.Unlimited)
	d.add("unit", ol.Unit, rl.Unit)
	d.add("unit_multiplier", ol.UnitMultiplier, rl.UnitMultiplier)
	d.add("algorithm", ol.Algorithm, rl.Algorithm)
	d.add("burst", ol.Burst, rl.Burst)
	d.add("lease", ol.Lease, rl.Lease)
	d.add("rejected_hits", ol.RejectedHits, rl.RejectedHits)
	if ol.CalendarSet || rl.CalendarSet {
		d.add("calendar", ol.Calendar, rl.Calendar)
	}
	d.add("name", ol.Name, rl.Name)
	d.add("replaces", strings.Join(ol.Replaces, ","), strings.Join(rl.Replaces, ","))
	if !ol.Unlimited && !rl.Unlimited && (ol.Window() != rl.Window() || ol.Algorithm != rl.Algorithm || ol.Calendar != rl.Calendar) {
		d.note("its counters start afresh (the window or algorithm is part of the counter key)")
	}
}
