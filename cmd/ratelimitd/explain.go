package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"strings"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/ratelimitd/ratelimitd/config"
	"github.com/ratelimitd/ratelimitd/internal/service"
)

// explained is one descriptor's explanation, as --json prints it.
type explained struct {
	Descriptor  string         `json:"descriptor"`
	Outcome     string         `json:"outcome"`
	Rule        *explainedRule `json:"rule,omitempty"`
	ReplacedBy  string         `json:"replaced_by,omitempty"`
	Override    bool           `json:"override,omitempty"`
	Description string         `json:"-"`
}

// explainedRule is the matching rule.
type explainedRule struct {
	Path            string   `json:"path"`
	File            string   `json:"file"`
	Line            int      `json:"line"`
	Unit            string   `json:"unit,omitempty"`
	UnitMultiplier  uint32   `json:"unit_multiplier,omitempty"`
	RequestsPerUnit uint64   `json:"requests_per_unit"`
	Unlimited       bool     `json:"unlimited,omitempty"`
	Algorithm       string   `json:"algorithm,omitempty"`
	Burst           uint32   `json:"burst,omitempty"`
	Lease           bool     `json:"lease,omitempty"`
	RejectedHits    string   `json:"rejected_hits,omitempty"`
	Calendar        bool     `json:"calendar,omitempty"`
	Name            string   `json:"name,omitempty"`
	Replaces        []string `json:"replaces,omitempty"`
	ShadowMode      bool     `json:"shadow_mode,omitempty"`
	QuotaMode       bool     `json:"quota_mode,omitempty"`
	FailureMode     string   `json:"failure_mode,omitempty"`
	ShareThreshold  bool     `json:"share_threshold,omitempty"`
}

// explain prints, for each descriptor given, the rule the server would
// match and what becomes of its limit, with no Redis and no server.
func explain(_ context.Context, args []string, out io.Writer) error {
	const cmd = "ratelimitd explain"
	fs := flag.NewFlagSet(cmd, flag.ContinueOnError)
	rulesPath := fs.String("config", "", "rules: a file or a directory, as the server's --config")
	asJSON := fs.Bool("json", false, "print JSON, for scripts")
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "Usage: ratelimitd explain --config PATH [--json] DOMAIN 'k=v,k2=v2' ['k=v'...]\n\n"+
			"Prints the rule each descriptor matches and what becomes of its limit, with\n"+
			"no Redis and no server. A descriptor is its entries, key=value, joined by\n"+
			"',', in the order Envoy's actions produce them.\n\nFlags:")
		fs.PrintDefaults()
	}
	if err := parseFlags(fs, cmd, args, out); err != nil {
		return helpIsDone(err)
	}
	if *rulesPath == "" || fs.NArg() < 2 {
		return usagef(cmd, "--config, a domain and at least one descriptor are needed")
	}
	rules, err := config.Load(*rulesPath)
	if err != nil {
		return fmt.Errorf("explain: %w", err)
	}
	req := &rlsv3.RateLimitRequest{Domain: fs.Arg(0)}
	for _, arg := range fs.Args()[1:] {
		d := &rlcommon.RateLimitDescriptor{}
		for _, kv := range strings.Split(arg, ",") {
			k, v, ok := strings.Cut(kv, "=")
			if !ok || k == "" {
				return fmt.Errorf("explain: descriptor %q: want key=value entries joined by ','", arg)
			}
			d.Entries = append(d.Entries, &rlcommon.RateLimitDescriptor_Entry{Key: k, Value: v})
		}
		req.Descriptors = append(req.Descriptors, d)
	}
	exps, err := service.Explain(rules, req)
	if err != nil {
		return fmt.Errorf("explain: %w", err)
	}
	if rules.Domain(req.GetDomain()) == nil {
		fmt.Fprintf(out, "domain %q: not in the rules (known: %s); nothing is limited\n", req.GetDomain(), strings.Join(rules.Domains(), ", "))
	}
	res := make([]explained, len(exps))
	for i, e := range exps {
		res[i] = describe(fs.Arg(i+1), e)
	}
	if *asJSON {
		enc := json.NewEncoder(out)
		enc.SetIndent("", "  ")
		return enc.Encode(res)
	}
	for i, r := range res {
		fmt.Fprintf(out, "descriptors[%d] %s: %s\n", i, r.Descriptor, r.Description)
	}
	return nil
}

// describe turns one explanation into its printed forms.
func describe(desc string, e service.Explanation) explained {
	x := explained{Descriptor: desc, Outcome: e.Outcome, ReplacedBy: e.ReplacedBy, Override: e.Override}
	if e.Override {
		x.Description = "its own limit (a request override), counted on its entries"
		return x
	}
	r := e.Rule
	if r == nil {
		x.Description = "no rule: not limited"
		return x
	}
	x.Rule = explainRule(r)
	var b strings.Builder
	fmt.Fprintf(&b, "rule %s (%s:%d)", r.Path, r.File, r.Line)
	switch e.Outcome {
	case service.ReasonNoRule:
		b.WriteString(": no rate_limit: not limited")
	case service.OutcomeUnlimited:
		b.WriteString(": unlimited")
	case service.ReasonReplaced:
		fmt.Fprintf(&b, ": its limit %q is replaced by the limit of %s (another descriptor of the request): not limited", x.Rule.Name, e.ReplacedBy)
	default:
		b.WriteString(": " + limitSummary(r) + x.Rule.details())
	}
	x.Description = b.String()
	return x
}

// explainRule is what explain shows of a rule.
func explainRule(r *config.Rule) *explainedRule {
	xr := &explainedRule{Path: r.Path, File: r.File, Line: r.Line, ShadowMode: r.ShadowMode, QuotaMode: r.QuotaMode,
		ShareThreshold: r.ShareThreshold}
	if r.FailureMode != config.FailureUnset {
		xr.FailureMode = r.FailureMode.String()
	}
	l := r.Limit
	if l == nil {
		return xr
	}
	xr.RequestsPerUnit, xr.Unlimited, xr.Name, xr.Replaces = l.RequestsPerUnit, l.Unlimited, l.Name, l.Replaces
	if l.Unlimited {
		return xr
	}
	xr.Unit, xr.UnitMultiplier, xr.Algorithm = l.Unit.String(), l.UnitMultiplier, l.Algorithm.String()
	if l.Burst > 0 {
		xr.Burst = l.Burst
	}
	xr.Lease, xr.Calendar = l.Lease, l.Calendar
	if l.RejectedHits != config.RejectedUnset {
		xr.RejectedHits = l.RejectedHits.String()
	}
	return xr
}

// details are a limited rule's settings beyond its limit, for its
// description.
func (xr *explainedRule) details() string {
	var b strings.Builder
	if xr.Name != "" {
		fmt.Fprintf(&b, ", name %q", xr.Name)
	}
	if len(xr.Replaces) > 0 {
		fmt.Fprintf(&b, ", replaces %s", strings.Join(xr.Replaces, ", "))
	}
	if xr.ShareThreshold {
		b.WriteString(", one counter for every matching value")
	}
	if xr.FailureMode != "" {
		fmt.Fprintf(&b, ", failure_mode %s", xr.FailureMode)
	}
	if xr.RejectedHits != "" {
		fmt.Fprintf(&b, ", rejected_hits %s", xr.RejectedHits)
	}
	if xr.Calendar {
		b.WriteString(", by the UTC calendar " + xr.Unit)
	}
	return b.String()
}
