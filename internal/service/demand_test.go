package service_test

import (
	"context"
	"testing"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/ratelimitd/ratelimitd/internal/memstore"
	"github.com/ratelimitd/ratelimitd/internal/plan"
	"github.com/ratelimitd/ratelimitd/internal/service"
)

// TestDemandCountsWatched: the hits ShouldRateLimit is asked for on a
// watched counter are counted, refused calls and stated hits included; a
// counter not watched, or no longer, counts nothing.
func TestDemandCountsWatched(t *testing.T) {
	s := service.New(parseRules(t, `
domain: web
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 3}
`), memstore.New(memstore.Options{}), nil, service.Options{})
	ents := func(v string) []*rlcommon.RateLimitDescriptor_Entry {
		return []*rlcommon.RateLimitDescriptor_Entry{{Key: "user", Value: v}}
	}
	call := func(v string, hits uint32) {
		t.Helper()
		if _, err := s.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "web", HitsAddend: hits,
			Descriptors: []*rlcommon.RateLimitDescriptor{{Entries: ents(v)}}}); err != nil {
			t.Fatal(err)
		}
	}
	key := func(v string) string {
		p, err := s.PlanBucket("web", ents(v))
		if err != nil || p.Kind != plan.Counted {
			t.Fatalf("plan of %s: %+v, %v", v, p, err)
		}
		return p.Check.Key
	}
	d := s.Demand()
	call("alice", 0) // before any watch: nothing counted
	d.Watch(key("alice"))
	for range 5 { // 3 allowed, 2 refused
		call("alice", 0)
	}
	call("alice", 4)
	call("bob", 0)
	if got := d.Hits(key("alice")); got != 9 {
		t.Errorf("alice's demand %d, want 9 (five calls and one of 4 hits)", got)
	}
	if got := d.Hits(key("bob")); got != 0 {
		t.Errorf("bob's demand %d, want 0: not watched", got)
	}
	d.Unwatch(key("alice"))
	call("alice", 0)
	if got := d.Hits(key("alice")); got != 0 {
		t.Errorf("alice's demand %d once unwatched, want 0", got)
	}
}
