package incumbentstats

import (
	"log/slog"
	"maps"
	"testing"

	"github.com/prometheus/statsd_exporter/pkg/mapper"
)

// TestDefaultMapper: every counter of a rule maps to the incumbent's
// series, with the domain and the first two levels as labels, for keys of
// two, three and more parts alike.
func TestDefaultMapper(t *testing.T) {
	m := &mapper.MetricMapper{Logger: slog.New(slog.DiscardHandler)}
	if err := m.InitFromYAMLString(DefaultMapping()); err != nil {
		t.Fatal(err)
	}
	for _, suffix := range []string{"total_hits", "over_limit", "near_limit", "within_limit", "shadow_mode"} {
		for _, c := range []struct {
			key    string
			labels map[string]string
		}{
			{"d.k_v", map[string]string{"domain": "d", "key1": "k_v"}},
			{"d.k_v.sub", map[string]string{"domain": "d", "key1": "k_v", "key2": "sub"}},
			{"d.masked_remote_address_10_0_0_0/8.remote_address", map[string]string{"domain": "d", "key1": "masked_remote_address_10_0_0_0/8", "key2": "remote_address"}},
			{"d.a.b.c.d", map[string]string{"domain": "d", "key1": "a", "key2": "b"}},
		} {
			name := "ratelimit.service.rate_limit." + c.key + "." + suffix
			mp, labels, ok := m.GetMapping(name, mapper.MetricTypeCounter)
			if !ok {
				t.Errorf("%s: no mapping", name)
				continue
			}
			if want := "ratelimit_service_rate_limit_" + suffix; mp.Name != want || !maps.Equal(labels, c.labels) {
				t.Errorf("%s: %s%v, want %s%v", name, mp.Name, labels, want, c.labels)
			}
		}
	}
}
