// Package xds receives rules from an xDS management server, as
// envoyproxy/ratelimit's CONFIG_TYPE=GRPC_XDS_SOTW does: an ADS stream,
// State of the World, of go-control-plane's RateLimitConfig resources,
// one domain each. Every set received is validated whole, exactly like a
// set of rules files (each resource is rendered in the rules format and
// parsed by package config), then ACKed and handed over; an invalid set
// is NACKed with its errors and the rules in force stay. When the server
// goes away the stream is opened again with backoff, and the rules in
// force stay meanwhile.
package xds

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/ratelimitd/ratelimitd/internal/fielderr"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	sotw "github.com/envoyproxy/go-control-plane/pkg/client/sotw/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	rlsconf "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/structpb"
	"gopkg.in/yaml.v3"

	"github.com/ratelimitd/ratelimitd/config"
)

// TypeURL is the resource type asked for.
const TypeURL = resource.RateLimitConfigType

// Defaults of the options.
const (
	DefaultNodeID         = "default"
	DefaultBackoffInitial = time.Second
	DefaultBackoffMax     = 30 * time.Second
	DefaultMaxMessage     = 4 << 20
	// maxNack bounds the error text sent back in a NACK: the management
	// server logs it, and a set can hold thousands of problems.
	maxNack = 4096
	// A set the server sends again after it was refused is refused
	// again after a pause that doubles between these bounds.
	nackRepeatMin = 250 * time.Millisecond
	nackRepeatMax = 5 * time.Second
)

// Options configure [Run].
type Options struct {
	// Server is the management server's address, host:port (or any
	// gRPC target).
	Server string
	// NodeID and NodeMetadata identify this instance to the server,
	// whose snapshot cache is usually keyed by the node ID.
	NodeID       string
	NodeMetadata map[string]string
	// Headers are sent as gRPC metadata when the stream opens (an
	// authorization token, say).
	Headers map[string]string
	// TLS, when set, secures the connection; nil is plaintext.
	TLS *tls.Config
	// MaxMessage bounds a response's size in bytes.
	MaxMessage int
	// BackoffInitial and BackoffMax bound the wait before opening the
	// stream again: it doubles from the first to the second, with
	// jitter, and starts over once a stream has delivered a response.
	BackoffInitial, BackoffMax time.Duration
	// Load is how a set is read (merged domains or not).
	Load config.Options
	// OnLoad is called with each valid set that differs from the last
	// one, or with the error of an invalid set (the caller keeps the
	// rules in force). Calls come one at a time.
	OnLoad func(*config.Snapshot, error)
	// Metrics gets whether the stream is open.
	Metrics *Metrics
	Logger  *slog.Logger
}

// Validate refuses options no client can run with, naming the field.
// Zero values stand for the defaults.
func (o Options) Validate() error {
	switch {
	case o.MaxMessage != 0 && o.MaxMessage < 1024:
		return fielderr.Errorf("xds", "MaxMessage", "%d: want at least 1024", o.MaxMessage)
	case o.BackoffInitial < 0:
		return fielderr.Errorf("xds", "BackoffInitial", "%v: want positive", o.BackoffInitial)
	case o.BackoffMax != 0 && o.BackoffMax < o.BackoffInitial:
		return fielderr.Errorf("xds", "BackoffMax", "%v: shorter than the initial backoff (%v)", o.BackoffMax, o.BackoffInitial)
	}
	return nil
}

// Run keeps a stream to the management server open until ctx is done,
// and calls o.OnLoad with what arrives. It returns an error only when it
// cannot start (a target gRPC cannot parse).
func Run(ctx context.Context, o Options) error {
	if o.NodeID == "" {
		o.NodeID = DefaultNodeID
	}
	if o.BackoffInitial <= 0 {
		o.BackoffInitial = DefaultBackoffInitial
	}
	if o.BackoffMax < o.BackoffInitial {
		o.BackoffMax = max(DefaultBackoffMax, o.BackoffInitial)
	}
	if o.MaxMessage <= 0 {
		o.MaxMessage = DefaultMaxMessage
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	creds := insecure.NewCredentials()
	if o.TLS != nil {
		creds = credentials.NewTLS(o.TLS)
	}
	conn, err := grpc.NewClient(o.Server, grpc.WithTransportCredentials(creds),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(o.MaxMessage)),
		grpc.WithUserAgent("ratelimitd-xds"),
		// The connection's own reconnects follow the same backoff as
		// the stream's (gRPC's default starts at 1 s).
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: o.BackoffInitial, Multiplier: 2, Jitter: 0.2, MaxDelay: o.BackoffMax},
			MinConnectTimeout: 5 * time.Second,
		}))
	if err != nil {
		return fmt.Errorf("xds: server %q: %w", o.Server, err)
	}
	defer conn.Close()
	node, err := nodeOf(o.NodeID, o.NodeMetadata)
	if err != nil {
		return err
	}
	sctx := ctx
	if len(o.Headers) > 0 {
		sctx = metadata.NewOutgoingContext(ctx, metadata.New(o.Headers))
	}
	// One client for the process: it remembers the version last
	// accepted and says so when a stream opens again, so a server that
	// still holds that version need not send it twice.
	client := sotw.NewADSClient(sctx, node, TypeURL)
	st := &stream{o: o, conn: conn, client: client}
	wait := o.BackoffInitial
	for {
		got, err := st.serve(ctx)
		o.Metrics.XDSStream(false)
		if ctx.Err() != nil {
			return nil
		}
		if got {
			wait = o.BackoffInitial
		}
		// Full jitter within [wait/2, wait]: instances that lost the same
		// server do not come back in step.
		d := wait/2 + rand.N(wait/2+1)
		o.Logger.Warn("xds: stream to the management server ended; keeping the rules in force and trying again",
			"server", o.Server, "err", err, "retry_in", d.Round(time.Millisecond))
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(d):
		}
		wait = min(2*wait, o.BackoffMax)
	}
}

// stream is one Run's state across streams.
type stream struct {
	o        Options
	conn     *grpc.ClientConn
	client   sotw.ADSClient
	lastHash string // of the rules last handed over
	// The set last refused: its hash and error, and how long to wait
	// before refusing it again.
	badSum    [sha256.Size]byte
	badErr    string
	badRepeat time.Duration
}

// serve opens one stream and serves it until it fails; got says
// whether it delivered a response.
func (s *stream) serve(ctx context.Context) (got bool, err error) {
	if err := s.client.InitConnect(s.conn); err != nil {
		return false, err
	}
	s.o.Metrics.XDSStream(true)
	s.o.Logger.Info("xds: stream open", "server", s.o.Server, "node", s.o.NodeID)
	for {
		resp, err := s.client.Fetch()
		if err != nil {
			return got, err
		}
		got = true
		sum := setSum(resp.Resources)
		if s.badErr != "" && sum == s.badSum {
			// go-control-plane's cache answers a NACK by sending its
			// snapshot again, which is refused again: without a pause
			// the two would loop as fast as the network goes. The set
			// was reported once; a fix waits at most nackRepeatMax.
			wait := s.badRepeat
			s.badRepeat = min(2*s.badRepeat, nackRepeatMax)
			select {
			case <-ctx.Done():
				return got, ctx.Err()
			case <-time.After(wait):
			}
			if err := s.client.Nack(s.badErr); err != nil {
				return got, err
			}
			continue
		}
		snap, err := Load(ctx, s.o.Load, resp.Resources)
		if err != nil {
			if ctx.Err() != nil {
				return got, ctx.Err()
			}
			s.o.OnLoad(nil, err)
			s.badSum, s.badErr, s.badRepeat = sum, config.Truncate(err.Error(), maxNack), nackRepeatMin
			if err := s.client.Nack(s.badErr); err != nil {
				return got, err
			}
			continue
		}
		s.badErr = ""
		if snap.Hash != s.lastHash {
			s.lastHash = snap.Hash
			s.o.OnLoad(snap, nil)
		}
		if err := s.client.Ack(); err != nil {
			return got, err
		}
	}
}

// setSum identifies a set of resources in any order: go-control-plane
// sends a snapshot's resources in map order.
func setSum(rs []*anypb.Any) [sha256.Size]byte {
	sums := make([][sha256.Size]byte, len(rs))
	for i, r := range rs {
		sums[i] = sha256.Sum256(append([]byte(r.GetTypeUrl()+"\x00"), r.GetValue()...))
	}
	slices.SortFunc(sums, func(a, b [sha256.Size]byte) int { return bytes.Compare(a[:], b[:]) })
	h := sha256.New()
	for _, s := range sums {
		h.Write(s[:])
	}
	var sum [sha256.Size]byte
	h.Sum(sum[:0])
	return sum
}

// Load validates and compiles a set of RateLimitConfig resources as one
// set of rules, exactly as package config does files: each resource
// stands for one file, named by its name, and is rendered in the rules
// format so that the same checks give the same errors.
func Load(ctx context.Context, opts config.Options, resources []*anypb.Any) (*config.Snapshot, error) {
	docs := make([]config.Doc, 0, len(resources))
	var errs []error
	for i, r := range resources {
		var rc rlsconf.RateLimitConfig
		if err := r.UnmarshalTo(&rc); err != nil {
			errs = append(errs, fmt.Errorf("resource %d (%s): %w", i, r.GetTypeUrl(), err))
			continue
		}
		name := rc.GetName()
		if name == "" {
			name = fmt.Sprintf("resource %d", i)
		}
		data, err := Render(&rc)
		if err == nil {
			err = unknownUnits(rc.GetDomain(), rc.GetDescriptors(), "descriptors")
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", name, err))
			continue
		}
		docs = append(docs, config.Doc{Name: name, Data: data})
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	// By name, as files load in sorted order: the same set then has
	// the same hash, and merged domains the same order, however sent.
	slices.SortStableFunc(docs, func(a, b config.Doc) int { return strings.Compare(a.Name, b.Name) })
	return config.LoadDocs(ctx, opts, docs)
}

// The rules format, as far as a RateLimitConfig can say it. Empty keys
// are written out so that config reports them as a file's would be.
type (
	yamlDomain struct {
		Domain      string           `yaml:"domain"`
		Descriptors []yamlDescriptor `yaml:"descriptors,omitempty"`
	}
	yamlDescriptor struct {
		Key            string           `yaml:"key"`
		Value          string           `yaml:"value,omitempty"`
		RateLimit      *yamlLimit       `yaml:"rate_limit,omitempty"`
		ShadowMode     bool             `yaml:"shadow_mode,omitempty"`
		DetailedMetric bool             `yaml:"detailed_metric,omitempty"`
		QuotaMode      bool             `yaml:"quota_mode,omitempty"`
		Descriptors    []yamlDescriptor `yaml:"descriptors,omitempty"`
	}
	yamlLimit struct {
		Unit            string        `yaml:"unit,omitempty"`
		RequestsPerUnit *uint32       `yaml:"requests_per_unit,omitempty"`
		Unlimited       bool          `yaml:"unlimited,omitempty"`
		Name            string        `yaml:"name,omitempty"`
		Replaces        []yamlReplace `yaml:"replaces,omitempty"`
		Global          bool          `yaml:"global,omitempty"`
	}
	yamlReplace struct {
		Name string `yaml:"name"`
	}
)

// GlobalNamePrefix marks a policy of a RateLimitConfig as global (one
// limit across regions, rate_limit.global in a file): its name starts
// with it, as global/tenant-cap.
const GlobalNamePrefix = "global/"

// Render writes a RateLimitConfig in the rules format.
func Render(rc *rlsconf.RateLimitConfig) ([]byte, error) {
	return yaml.Marshal(yamlDomain{Domain: rc.GetDomain(), Descriptors: renderDescriptors(rc.GetDescriptors())})
}

func renderDescriptors(ds []*rlsconf.RateLimitDescriptor) []yamlDescriptor {
	out := make([]yamlDescriptor, 0, len(ds))
	for _, d := range ds {
		y := yamlDescriptor{Key: d.GetKey(), Value: d.GetValue(), ShadowMode: d.GetShadowMode(),
			DetailedMetric: d.GetDetailedMetric(), Descriptors: renderDescriptors(d.GetDescriptors())}
		if p := d.GetRateLimit(); p != nil {
			l := &yamlLimit{Unlimited: p.GetUnlimited(), Name: p.GetName()}
			// An unlimited policy leaves unit and count at their zero
			// values; a limited one names both, so that a missing unit is
			// the error it is in a file.
			if !l.Unlimited || p.GetUnit() != rlsconf.RateLimitUnit_UNKNOWN {
				l.Unit = unitName(p.GetUnit())
			}
			if quota, ok := quotaMode(d); ok {
				y.QuotaMode = quota
			}
			if rpu := p.GetRequestsPerUnit(); !l.Unlimited || rpu != 0 {
				l.RequestsPerUnit = &rpu
			}
			for _, r := range p.GetReplaces() {
				l.Replaces = append(l.Replaces, yamlReplace{Name: r.GetName()})
			}
			// RateLimitConfig has no field for it: a policy named
			// global/<name> is rate_limit.global (docs/regions.md).
			l.Global = strings.HasPrefix(p.GetName(), GlobalNamePrefix) && !l.Unlimited
			y.RateLimit = l
		}
		out = append(out, y)
	}
	return out
}

// unitName is a unit's name in the rules format, by number: the
// RateLimitConfig module ratelimitd builds with (v0.1.0, the newest the
// module proxy serves) stops at DAY, but the proto Envoy Gateway and the
// incumbent send has MONTH = 5, YEAR = 6 and WEEK = 7, the same numbers
// config.Unit uses. A number neither knows is written as it came, and
// unknownUnits reports it naming the rule.
func unitName(u rlsconf.RateLimitUnit) string {
	if cu := config.Unit(u); cu.Duration() > 0 || u == rlsconf.RateLimitUnit_UNKNOWN {
		return cu.String()
	}
	return strconv.Itoa(int(u))
}

// unknownUnits names every rule of ds whose unit number no proto version
// defines: the whole set is still refused (a rule left out would stop
// limiting silently), but the NACK says which rule to fix.
func unknownUnits(domain string, ds []*rlsconf.RateLimitDescriptor, at string) error {
	var errs []error
	for i, d := range ds {
		here := fmt.Sprintf("%s[%d]", at, i)
		if u := d.GetRateLimit().GetUnit(); u != rlsconf.RateLimitUnit_UNKNOWN && config.Unit(u).Duration() == 0 {
			errs = append(errs, fmt.Errorf("%s (rule %s): rate_limit.unit %d is no unit of RateLimitConfig (want SECOND, MINUTE, HOUR, DAY, WEEK, MONTH or YEAR)",
				here, domain+"."+config.PathSegment(d.GetKey(), d.GetValue()), int32(u)))
		}
		if err := unknownUnits(domain+"."+config.PathSegment(d.GetKey(), d.GetValue()), d.GetDescriptors(), here+".descriptors"); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// quotaFieldNumber is RateLimitDescriptor.quota_mode in the current proto;
// v0.1.0's generated type keeps it among its unknown fields.
const quotaFieldNumber = 7

// quotaMode reads quota_mode from d's unknown fields, where the v0.1.0
// type leaves it: dropping it would turn a soft quota into a hard limit.
func quotaMode(d *rlsconf.RateLimitDescriptor) (quota, ok bool) {
	b := d.ProtoReflect().GetUnknown()
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return false, false
		}
		b = b[n:]
		if num == quotaFieldNumber && typ == protowire.VarintType {
			v, m := protowire.ConsumeVarint(b)
			if m < 0 {
				return false, false
			}
			b, quota, ok = b[m:], v != 0, true
			continue
		}
		m := protowire.ConsumeFieldValue(num, typ, b)
		if m < 0 {
			return false, false
		}
		b = b[m:]
	}
	return quota, ok
}

func nodeOf(id string, md map[string]string) (*core.Node, error) {
	n := &core.Node{Id: id, UserAgentName: "ratelimitd"}
	if len(md) > 0 {
		fields := make(map[string]any, len(md))
		for k, v := range md {
			fields[k] = v
		}
		s, err := structpb.NewStruct(fields)
		if err != nil {
			return nil, fmt.Errorf("xds: node metadata: %w", err)
		}
		n.Metadata = s
	}
	return n, nil
}
