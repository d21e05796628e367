package deploy_test

import (
	"encoding/json"
	"slices"
	"testing"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	rlqsfilter "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/rate_limit_quota/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/ratelimitd/ratelimitd/config"
)

// TestRLQSEnvoyConfig: the RLQS example is a valid bootstrap whose filter
// is strict (DENY_ALL before an assignment and on expiry), names the
// rules' domain, and builds bucket ids with every rlqs.descriptor_keys
// key the rules list.
func TestRLQSEnvoyConfig(t *testing.T) {
	js, err := json.Marshal(yamlDocs(t, "rlqs/envoy.yaml")[0])
	if err != nil {
		t.Fatal(err)
	}
	var b bootstrapv3.Bootstrap
	if err := protojson.Unmarshal(js, &b); err != nil {
		t.Fatalf("rlqs/envoy.yaml is not a Bootstrap: %v", err)
	}
	if err := b.ValidateAll(); err != nil {
		t.Fatalf("rlqs/envoy.yaml fails Envoy's validation: %v", err)
	}
	var hcm hcmv3.HttpConnectionManager
	if err := b.GetStaticResources().GetListeners()[0].GetFilterChains()[0].GetFilters()[0].GetTypedConfig().UnmarshalTo(&hcm); err != nil {
		t.Fatal(err)
	}
	var f rlqsfilter.RateLimitQuotaFilterConfig
	if err := hcm.GetHttpFilters()[0].GetTypedConfig().UnmarshalTo(&f); err != nil {
		t.Fatal(err)
	}
	if err := f.ValidateAll(); err != nil {
		t.Fatalf("the RLQS filter config fails Envoy's validation: %v", err)
	}
	snap, err := config.Load("rlqs/rules.yaml")
	if err != nil {
		t.Fatal(err)
	}
	dom := snap.Domain(f.GetDomain())
	if dom == nil || dom.RLQSKeys == nil {
		t.Fatalf("the filter's domain %q has no rlqs keys in rlqs/rules.yaml", f.GetDomain())
	}
	if w := snap.Warnings(); len(w) > 0 {
		t.Errorf("check-config warns: %q", w)
	}
	ms := f.GetBucketMatchers().GetMatcherList().GetMatchers()
	if len(ms) == 0 {
		t.Fatal("no bucket matchers")
	}
	for _, m := range ms {
		var s rlqsfilter.RateLimitQuotaBucketSettings
		if err := m.GetOnMatch().GetAction().GetTypedConfig().UnmarshalTo(&s); err != nil {
			t.Fatal(err)
		}
		deny := typev3.RateLimitStrategy_DENY_ALL
		if s.GetNoAssignmentBehavior().GetFallbackRateLimit().GetBlanketRule() != deny ||
			s.GetExpiredAssignmentBehavior().GetFallbackRateLimit().GetBlanketRule() != deny {
			t.Error("the bucket settings are not strict: no_assignment and expired_assignment behaviours must be DENY_ALL")
		}
		for _, k := range dom.RLQSKeys {
			if _, ok := s.GetBucketIdBuilder().GetBucketIdBuilder()[k]; !ok {
				t.Errorf("bucket ids lack %q, a descriptor key of the rules", k)
			}
		}
		if got := s.GetBucketIdBuilder().GetBucketIdBuilder(); len(got) != len(dom.RLQSKeys) {
			keys := make([]string, 0, len(got))
			for k := range got {
				keys = append(keys, k)
			}
			slices.Sort(keys)
			t.Errorf("bucket id keys %q, want exactly the rules' %q", keys, dom.RLQSKeys)
		}
	}
}
