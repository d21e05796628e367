package service_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/redis/go-redis/v9"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/ratelimitd/ratelimitd/internal/memstore"
	"github.com/ratelimitd/ratelimitd/internal/persecond"
	"github.com/ratelimitd/ratelimitd/internal/redisstore"
	"github.com/ratelimitd/ratelimitd/internal/redisstore/redistest"
	"github.com/ratelimitd/ratelimitd/internal/service"
)

// topology is one way the stores are deployed, as ratelimitd assembles
// them: a service on it and the Redis clients that read its keys back
// (none for the embedded store).
type topology struct {
	name  string
	svc   *service.Service
	nodes []*redis.Client
}

// topologies starts every deployment a user runs — the embedded store, a
// single Redis, a Sentinel-watched master, a 3-master Cluster, and a
// single Redis beside a per-second one — each with a service on rules and
// opts, all on one scripted clock, which the returned function advances.
func topologies(t *testing.T, rules string, opts service.Options) ([]topology, func(time.Duration)) {
	t.Helper()
	var clock atomic.Int64
	// Ten minutes into an hour, whatever the wall clock says.
	clock.Store(time.Date(2026, 12, 4, 10, 10, 0, 0, time.UTC).UnixMicro())
	now := func() time.Time { return time.UnixMicro(clock.Load()) }
	snap := parseRules(t, rules)
	opts.Now = now
	open := func(url, mode string) *redisstore.Store {
		t.Helper()
		rs, err := redisstore.New(redisstore.Options{URL: url, Mode: mode, Timeout: 5 * time.Second, ScriptTime: now})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { rs.Close() })
		if err := rs.Ping(context.Background()); err != nil {
			t.Fatal(err)
		}
		return rs
	}
	single, main, fast := redistest.Start(t), redistest.Start(t), redistest.Start(t)
	sentinel := redistest.StartSentinel(t)
	cluster := redistest.StartCluster(t, 3)
	sentinelMaster, err := sentinel.MasterAddr(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	client := func(addr string) *redis.Client {
		c := redis.NewClient(&redis.Options{Addr: addr})
		t.Cleanup(func() { c.Close() })
		return c
	}
	var clusterNodes []*redis.Client
	for _, n := range cluster {
		clusterNodes = append(clusterNodes, n.Client())
	}
	stores := []struct {
		name  string
		store service.Store
		nodes []*redis.Client
	}{
		{"embedded", memstore.New(memstore.Options{Now: now}), nil},
		{"single", open(single.URL(), ""), []*redis.Client{single.Client()}},
		{"sentinel", open(sentinel.URL(), ""), []*redis.Client{client(sentinelMaster)}},
		{"cluster", open(redistest.ClusterURL(cluster), redisstore.ModeCluster), clusterNodes},
		{"per-second", &persecond.Store{Main: open(main.URL(), ""), PerSecond: open(fast.URL(), "")},
			[]*redis.Client{main.Client(), fast.Client()}},
	}
	var out []topology
	for _, s := range stores {
		out = append(out, topology{name: s.name, svc: service.New(snap, s.store, nil, opts), nodes: s.nodes})
	}
	return out, func(d time.Duration) { clock.Add(d.Microseconds()) }
}

// answer renders a response as a comparable line: the overall code and
// each status's code, limit, remaining count and reset.
func answer(r *rlsv3.RateLimitResponse) string {
	var b strings.Builder
	b.WriteString(r.GetOverallCode().String())
	for _, st := range r.GetStatuses() {
		fmt.Fprintf(&b, " [%v %d %d %v]", st.GetCode(), st.GetCurrentLimit().GetRequestsPerUnit(), st.GetLimitRemaining(),
			st.GetDurationUntilReset().AsDuration())
	}
	return b.String()
}

// keyValues returns every key a topology's Redis holds, with its value;
// those due to expire within expiringSoon (by Redis's own clock, which
// the scripted one does not move) are listed in soon as well.
func keyValues(t *testing.T, nodes []*redis.Client) (out map[string]string, soon map[string]bool) {
	t.Helper()
	ctx := context.Background()
	out, soon = map[string]string{}, map[string]bool{}
	for _, c := range nodes {
		keys, err := c.Keys(ctx, "*").Result()
		if err != nil {
			t.Fatal(err)
		}
		for _, k := range keys {
			v, err := c.Get(ctx, k).Result()
			if err != nil {
				// A replica's view or a key that expired between
				// the two calls: neither is this store's state.
				continue
			}
			ttl := c.PTTL(ctx, k).Val()
			if ttl < 0 {
				t.Errorf("key %s (%s) has no TTL", k, v)
			}
			out[k] = v
			if ttl >= 0 && ttl < expiringSoon {
				soon[k] = true
			}
		}
	}
	return out, soon
}

// expiringSoon: a key this near its expiry when one topology's Redis is
// read may be gone when the next is, on a crowded machine (a token
// bucket's key of a 2-a-second rule lives a few seconds).
const expiringSoon = 30 * time.Second

// sameKeys reports the keys whose values differ between two reads,
// leaving out a key only one holds while it was near its expiry there.
func sameKeys(a, b map[string]string, aSoon, bSoon map[string]bool) []string {
	var diff []string
	for _, k := range sortedKeys(a, b) {
		av, aok := a[k]
		bv, bok := b[k]
		if aok != bok && (aSoon[k] || bSoon[k]) || av == bv {
			continue
		}
		diff = append(diff, k)
	}
	return diff
}

// topologyRules are limits of every kind a request can mix, so that one
// request's descriptors fall in different hash slots and, for the
// per-second topology, in both Redis: plain request limits (left to
// --rejected-hits, the default usage), a rule that consumes nothing when
// refused, a token budget charged at stream end, per-second limits,
// shadow and quota-mode counters, a sliding window and a token bucket.
const topologyRules = `
domain: topo
descriptors:
  - key: minute
    rate_limit: {unit: minute, requests_per_unit: 12}
  - key: hour
    rate_limit: {unit: hour, requests_per_unit: 8}
  - key: nothing
    rate_limit: {unit: minute, requests_per_unit: 9, rejected_hits: nothing}
  - key: second
    rate_limit: {unit: second, requests_per_unit: 3}
  - key: budget
    rate_limit: {unit: hour, requests_per_unit: 400}
  - key: shadow
    shadow_mode: true
    rate_limit: {unit: hour, requests_per_unit: 4}
  - key: quota
    quota_mode: true
    rate_limit: {unit: hour, requests_per_unit: 5}
  - key: quota2
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: sliding
    rate_limit: {unit: minute, requests_per_unit: 6, algorithm: sliding_window}
  - key: bucket
    rate_limit: {unit: second, requests_per_unit: 2, algorithm: token_bucket, burst: 4}
`

// topologyRequest is a seeded request of one to four descriptors of
// topologyRules: plain calls, stated hits at request and descriptor
// level, budget checks and stream-end charges, refunds.
func topologyRequest(rng *rand.Rand) *rlsv3.RateLimitRequest {
	keys := []string{"minute", "hour", "nothing", "second", "budget", "shadow", "quota", "quota2", "sliding", "bucket"}
	req := &rlsv3.RateLimitRequest{Domain: "topo"}
	switch rng.IntN(4) {
	case 0:
		req.HitsAddend = uint32(rng.IntN(3))
	}
	for range 1 + rng.IntN(4) {
		k := keys[rng.IntN(len(keys))]
		d := &rlcommon.RateLimitDescriptor{Entries: []*rlcommon.RateLimitDescriptor_Entry{{Key: k, Value: fmt.Sprint("v", rng.IntN(3))}}}
		switch r := rng.IntN(10); {
		case k == "budget" && r < 4:
			d.HitsAddend = wrapperspb.UInt64(uint64(rng.IntN(60))) // a stream end's charge, or 0
		case r == 0:
			d.HitsAddend = wrapperspb.UInt64(0)
		case r == 1:
			d.HitsAddend = wrapperspb.UInt64(uint64(1 + rng.IntN(3)))
		case r == 2 && rng.IntN(4) == 0:
			req.Descriptors = append(req.Descriptors, d)
			d = &rlcommon.RateLimitDescriptor{Entries: d.Entries, HitsAddend: wrapperspb.UInt64(1)}
			req.HitsAddend = 0
		}
		req.Descriptors = append(req.Descriptors, d)
	}
	return req
}

// TestSameAnswersOnEveryTopology sends the same seeded traffic — plain
// calls, stated hits, request- and descriptor-level hits, budget checks
// and charges, refusals across descriptors in different hash slots and
// in both Redis of the per-second split, shadow and quota-mode rules — to
// the embedded store, a single Redis, Sentinel, a 3-master Cluster and a
// single Redis beside a per-second one: every answer and every counter
// must be the same. A refused request gives back what its other
// descriptors consumed whatever the slot order; only a stated usage
// charge is kept.
func TestSameAnswersOnEveryTopology(t *testing.T) {
	tops, advance := topologies(t, topologyRules, service.Options{})
	rng := rand.New(rand.NewPCG(59, 1))
	ctx := context.Background()
	refused, mixed := 0, 0
	for i := range 2500 {
		switch r := rng.IntN(40); {
		case r == 0:
			advance(time.Duration(rng.Int64N(70)) * time.Second) // windows end, flights expire
		case r < 20:
			advance(time.Duration(rng.Int64N(400)) * time.Millisecond)
		}
		req := topologyRequest(rng)
		var want string
		for j, tp := range tops {
			resp, err := tp.svc.ShouldRateLimit(ctx, req)
			if err != nil {
				t.Fatalf("request %d on %s: %v", i, tp.name, err)
			}
			got := answer(resp)
			if j == 0 {
				want = got
				if resp.GetOverallCode() == rlsv3.RateLimitResponse_OVER_LIMIT {
					refused++
					if strings.Contains(got, "OK") {
						mixed++
					}
				}
				continue
			}
			if got != want {
				t.Fatalf("request %d %v:\n%-10s %s\n%-10s %s\ncounters:%s", i, req, tops[0].name, want, tp.name, got, counterDiff(t, tops[1], tp))
			}
		}
	}
	if refused < 200 || mixed < 100 {
		t.Fatalf("%d requests refused, %d of them beside a descriptor within its limit: the traffic proves nothing", refused, mixed)
	}
	// Every counter the same in every Redis topology (the embedded
	// store's answered the same above).
	want, wantSoon := keyValues(t, tops[1].nodes)
	if len(want) < 20 {
		t.Fatalf("%d keys in the single Redis: the traffic touched too little", len(want))
	}
	for _, tp := range tops[2:] {
		got, gotSoon := keyValues(t, tp.nodes)
		for _, k := range sameKeys(want, got, wantSoon, gotSoon) {
			t.Errorf("%s: key %q holds %q, single Redis %q", tp.name, k, got[k], want[k])
		}
	}
	t.Logf("2,500 requests, %d refused (%d beside a descriptor within its limit), %d keys: identical on every topology", refused, mixed, len(want))
}

// counterDiff lists the keys whose values differ between two
// topologies' Redis (none for the embedded store).
func counterDiff(t *testing.T, a, b topology) string {
	t.Helper()
	if b.nodes == nil {
		return " (the embedded store's are not read)"
	}
	av, _ := keyValues(t, a.nodes)
	bv, _ := keyValues(t, b.nodes)
	var out strings.Builder
	for _, k := range sortedKeys(av, bv) {
		if av[k] != bv[k] {
			fmt.Fprintf(&out, "\n  %q: %s %q, %s %q", k, a.name, av[k], b.name, bv[k])
		}
	}
	return out.String()
}

// sortedKeys is the union of two maps' keys, sorted.
func sortedKeys(a, b map[string]string) []string {
	var ks []string
	for k := range a {
		ks = append(ks, k)
	}
	for k := range b {
		if _, ok := a[k]; !ok {
			ks = append(ks, k)
		}
	}
	slices.Sort(ks)
	return ks
}

// TestIncumbentSuiteRequestOnEveryTopology is envoyproxy/ratelimit's
// integration suite's request (key2 20 a minute beside key3 10 an hour,
// hits unset, 15 calls per value: calls 11 to 15 refused by key3) for 12
// values on every topology: key2 keeps the 10 it had when key3 ran out,
// whichever of the two keys' hash slots sorts first on the Cluster.
func TestIncumbentSuiteRequestOnEveryTopology(t *testing.T) {
	rules := "domain: another\ndescriptors:\n  - key: key2\n    rate_limit: {unit: minute, requests_per_unit: 20}\n" +
		"  - key: key3\n    rate_limit: {unit: hour, requests_per_unit: 10}\n"
	tops, _ := topologies(t, rules, service.Options{})
	ctx := context.Background()
	for _, tp := range tops {
		for v := range 12 {
			val := fmt.Sprint("value-", v)
			req := func(keys ...string) *rlsv3.RateLimitRequest {
				r := &rlsv3.RateLimitRequest{Domain: "another"}
				for _, k := range keys {
					r.Descriptors = append(r.Descriptors, &rlcommon.RateLimitDescriptor{Entries: []*rlcommon.RateLimitDescriptor_Entry{{Key: k, Value: val}}})
				}
				return r
			}
			for i := range 15 {
				resp, err := tp.svc.ShouldRateLimit(ctx, req("key2", "key3"))
				if err != nil {
					t.Fatal(err)
				}
				wantCode := rlsv3.RateLimitResponse_OK
				if i >= 10 {
					wantCode = rlsv3.RateLimitResponse_OVER_LIMIT
				}
				if resp.GetOverallCode() != wantCode {
					t.Fatalf("%s %s call %d: %s", tp.name, val, i+1, answer(resp))
				}
			}
			// A peek (hits 0 on a plain rule reads) at key2 alone.
			peek := req("key2")
			peek.Descriptors[0].HitsAddend = wrapperspb.UInt64(0)
			resp, err := tp.svc.ShouldRateLimit(ctx, peek)
			if err != nil {
				t.Fatal(err)
			}
			if left := resp.GetStatuses()[0].GetLimitRemaining(); left != 10 {
				t.Errorf("%s %s: key2 has %d left after its request was refused 5 times, want 10", tp.name, val, left)
			}
		}
	}
}
