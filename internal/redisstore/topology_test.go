package redisstore_test

import (
	"cmp"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/redis/go-redis/v9"

	"github.com/ratelimitd/ratelimitd/internal/lease"
	"github.com/ratelimitd/ratelimitd/internal/limit"
	"github.com/ratelimitd/ratelimitd/internal/redisstore"
	"github.com/ratelimitd/ratelimitd/internal/redisstore/redistest"
)

// tlsFiles loads the test CA and client pair as the options' functions.
func tlsFiles(t *testing.T, certs *redistest.Certs) (func() *tls.Certificate, func() *x509.CertPool) {
	t.Helper()
	conf := certs.ClientTLS()
	return func() *tls.Certificate { return &conf.Certificates[0] }, func() *x509.CertPool { return conf.RootCAs }
}

func TestTLS(t *testing.T) {
	certs := redistest.NewCerts(t)
	srv := redistest.StartTLS(t, certs)
	url := "rediss://" + srv.Addr()
	cert, roots := tlsFiles(t, certs)
	s, err := redisstore.New(redisstore.Options{URL: url, Timeout: time.Second, ClientCert: cert, RootCAs: roots})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if r, err := s.Evaluate(context.Background(), hourCheck); err != nil || r[0].Used(1000) != 1 {
		t.Fatalf("over TLS: %+v, %v", r, err)
	}
	// Without the client certificate Redis refuses the handshake.
	noCert, err := redisstore.New(redisstore.Options{URL: url, Timeout: time.Second, RootCAs: roots})
	if err != nil {
		t.Fatal(err)
	}
	defer noCert.Close()
	if _, err := noCert.Evaluate(context.Background(), hourCheck); err == nil {
		t.Error("a client without certificate was served")
	}
	// A server signed by another CA is refused: the verification that
	// replaces crypto/tls's checks the chain.
	_, otherRoots := tlsFiles(t, redistest.NewCerts(t))
	other, err := redisstore.New(redisstore.Options{URL: url, Timeout: time.Second, ClientCert: cert, RootCAs: otherRoots})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	if _, err := other.Evaluate(context.Background(), hourCheck); err == nil {
		t.Error("a Redis certificate from an unknown CA was accepted")
	}
	if _, err := redisstore.New(redisstore.Options{URL: "redis://" + srv.Addr(), RootCAs: roots}); err == nil || !strings.Contains(err.Error(), "need a rediss:// URL") {
		t.Errorf("TLS files with redis:// = %v", err)
	}
}

func TestModeFromURL(t *testing.T) {
	tests := []struct{ url, mode, want string }{
		{"redis://127.0.0.1:1", "", redisstore.ModeSingle},
		{"redis://127.0.0.1:26379?master_name=m&addr=127.0.0.1:26380", "", redisstore.ModeSentinel},
		{"redis://127.0.0.1:7000?addr=127.0.0.1:7001", "cluster", redisstore.ModeCluster},
	}
	for _, tt := range tests {
		s, err := redisstore.New(redisstore.Options{URL: tt.url, Mode: tt.mode})
		if err != nil {
			t.Fatalf("%s: %v", tt.url, err)
		}
		if s.Mode() != tt.want {
			t.Errorf("%s: mode %s, want %s", tt.url, s.Mode(), tt.want)
		}
		s.Close()
	}
	if _, err := redisstore.New(redisstore.Options{URL: "redis://x", Mode: "ring"}); err == nil || !strings.Contains(err.Error(), `mode "ring"`) {
		t.Errorf("bad mode: %v", err)
	}
}

// clusterKeys returns n keys named after base that land on n different
// cluster nodes.
func clusterKeys(t *testing.T, nodes []*redistest.Server, base string, n int) []string {
	t.Helper()
	ctx := context.Background()
	c := nodes[0].Client()
	seen := map[string]bool{}
	var keys []string
	for i := 0; len(keys) < n && i < 1000; i++ {
		k := fmt.Sprintf("%s:%d", base, i)
		sl, err := c.ClusterKeySlot(ctx, k).Result()
		if err != nil {
			t.Fatal(err)
		}
		node := fmt.Sprint(min(sl/(16384/3), 2))
		if !seen[node] {
			seen[node] = true
			keys = append(keys, k)
		}
	}
	return keys
}

// clusterStore starts a 3-master cluster and a store on it that has
// loaded the script on every master (and so learned the slot map).
// Options edits, if any, change the store's options.
func clusterStore(t *testing.T, edits ...func(*redisstore.Options)) ([]*redistest.Server, *redisstore.Store) {
	t.Helper()
	nodes := redistest.StartCluster(t, 3)
	opts := redisstore.Options{URL: redistest.ClusterURL(nodes), Mode: redisstore.ModeCluster, Timeout: 2 * time.Second}
	for _, edit := range edits {
		edit(&opts)
	}
	s, err := redisstore.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	if err := s.Ping(context.Background()); err != nil {
		t.Fatal(err)
	}
	return nodes, s
}

// scriptCalls is the number of script calls all nodes have run.
func scriptCalls(t *testing.T, nodes []*redistest.Server) int64 {
	t.Helper()
	var n int64
	for _, nd := range nodes {
		st, err := nd.CommandStats(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		n += st["evalsha"] + st["eval"]
	}
	return n
}

func TestCluster(t *testing.T) {
	nodes, s := clusterStore(t)
	ctx := context.Background()
	// Descriptors on three nodes decide together; a rejected request
	// consumes nothing anywhere. Slots are decided in ascending order, so
	// the limit-1 key goes in the highest slot: the request is rejected
	// in its last slot, after the two others consumed, and their refund
	// is what the test sees.
	keys := clusterKeys(t, nodes, "multi", 3)
	slotOf := func(k string) int64 { return nodes[0].Client().ClusterKeySlot(ctx, k).Val() }
	slices.SortFunc(keys, func(a, b string) int { return cmp.Compare(slotOf(a), slotOf(b)) })
	checks := []limit.Check{
		{Key: keys[0], Limit: 100, WindowUS: 3600e6, Hits: 1},
		{Key: keys[2], Limit: 1, WindowUS: 3600e6, Hits: 1},
		{Key: keys[1], Limit: 100, WindowUS: 3600e6, Hits: 1},
	}
	for i := range 4 {
		r, err := s.Evaluate(ctx, checks)
		if err != nil {
			t.Fatal(err)
		}
		if wantOver := i > 0; r[1].Over != wantOver {
			t.Fatalf("call %d: %+v", i, r)
		}
	}
	r, err := s.Evaluate(ctx, []limit.Check{{Key: keys[0], Limit: 100, WindowUS: 3600e6}, {Key: keys[1], Limit: 100, WindowUS: 3600e6}})
	if err != nil || r[0].Used(100) != 1 || r[1].Used(100) != 1 {
		t.Fatalf("after 3 rejected requests: %+v, %v; want counts 1 (refunded)", r, err)
	}

	// 200 concurrent requests, limit 10: exactly 10 on one key; and the
	// 3-slot case, where no rejected request may leave consumption behind.
	one := []limit.Check{{Key: "hot:" + fmt.Sprint(time.Now().UnixNano()), Limit: 10, WindowUS: 3600e6, Hits: 1}}
	three := make([]limit.Check, 3)
	for i, k := range clusterKeys(t, nodes, fmt.Sprint("conc", time.Now().UnixNano()), 3) {
		three[i] = limit.Check{Key: k, Limit: 10, WindowUS: 3600e6, Hits: 1}
	}
	for _, tt := range []struct {
		name   string
		checks []limit.Check
	}{{"one slot", one}, {"three nodes", three}} {
		calls0 := scriptCalls(t, nodes)
		var ok atomic.Int64
		var wg sync.WaitGroup
		gun := make(chan struct{})
		for range 200 {
			wg.Go(func() {
				<-gun
				r, err := s.Evaluate(ctx, tt.checks)
				if err != nil {
					t.Error(err)
					return
				}
				admitted := true
				for _, x := range r {
					admitted = admitted && !x.Over
				}
				if admitted {
					ok.Add(1)
				}
			})
		}
		close(gun)
		wg.Wait()
		counts := make([]string, len(tt.checks))
		for i, c := range tt.checks {
			rr, err := s.Evaluate(ctx, []limit.Check{{Key: c.Key, Limit: 10, WindowUS: 3600e6}})
			if err != nil {
				t.Fatal(err)
			}
			counts[i] = fmt.Sprint(rr[0].Used(10))
			if rr[0].Used(10) != uint64(ok.Load()) {
				t.Errorf("%s: counter %s = %d but %d requests admitted: rejected requests left consumption", tt.name, c.Key, rr[0].Used(10), ok.Load())
			}
		}
		// Batched per node: far fewer script calls than slot groups.
		calls := scriptCalls(t, nodes) - calls0 - int64(len(tt.checks))
		t.Logf("%s: 200 concurrent requests, limit 10: %d admitted; counters %s; %d script calls", tt.name, ok.Load(), strings.Join(counts, ","), calls)
		if calls >= 200 {
			t.Errorf("%s: %d script calls for 200 requests: not batched", tt.name, calls)
		}
		if ok.Load() != 10 {
			t.Errorf("%s: %d admitted, want exactly 10", tt.name, ok.Load())
		}
	}
}

// TestSentinelFailover kills the master under load: the store follows the
// promoted replica without a restart. Counts not yet replicated when the
// master died are lost (soft state); the test reports how many.
func TestSentinelFailover(t *testing.T) {
	st := redistest.StartSentinel(t)
	s, err := redisstore.New(redisstore.Options{URL: st.URL(), Timeout: 200 * time.Millisecond, ProbeInterval: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if s.Mode() != redisstore.ModeSentinel {
		t.Fatalf("mode %s", s.Mode())
	}
	ctx := context.Background()
	check := []limit.Check{{Key: "failover", Limit: 1 << 30, WindowUS: 3600e6 * 24, Hits: 1}}
	var admitted atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var failures atomic.Int64
	wg.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			if _, err := s.Evaluate(ctx, check); err != nil {
				failures.Add(1)
				time.Sleep(5 * time.Millisecond)
			} else {
				admitted.Add(1)
			}
		}
	})
	time.Sleep(500 * time.Millisecond)
	oldMaster := st.Master.Addr()
	st.Master.Kill()
	killedAt := time.Now()
	newMaster := st.AwaitFailover(t, oldMaster, 20*time.Second, 60*time.Second)
	deadline := time.Now().Add(30 * time.Second)
	// Decisions resume on the new master.
	before := admitted.Load()
	for admitted.Load() < before+50 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	close(stop)
	wg.Wait()
	if admitted.Load() < before+50 {
		t.Fatalf("no decisions after failover to %s", newMaster)
	}
	r, err := s.Evaluate(ctx, []limit.Check{{Key: "failover", Limit: 1 << 30, WindowUS: 3600e6 * 24}})
	if err != nil {
		t.Fatal(err)
	}
	// A call that timed out here may still have run on Redis: the counter
	// may exceed the admitted calls by at most the failed ones.
	lost := admitted.Load() - int64(r[0].Used(1<<30))
	t.Logf("failover %s -> %s in %v: %d decisions, %d failed calls while no master, counter %d: %d counts lost (the unreplicated tail; negative: timed-out calls that ran)",
		oldMaster, newMaster, time.Since(killedAt).Round(100*time.Millisecond), admitted.Load(), failures.Load(), r[0].Used(1<<30), lost)
	if -lost > failures.Load() {
		t.Errorf("counter %d above the %d admitted plus %d failed calls", r[0].Used(1<<30), admitted.Load(), failures.Load())
	}
}

// TestClusterMoved reassigns a slot to another master after the store has
// learned the slot map: Redis answers MOVED and the store follows it.
func TestClusterMoved(t *testing.T) {
	nodes, s := clusterStore(t) // the store has learned the slot map
	ctx := context.Background()
	key := "moved:" + fmt.Sprint(time.Now().UnixNano())
	sl, err := nodes[0].Client().ClusterKeySlot(ctx, key).Result()
	if err != nil {
		t.Fatal(err)
	}
	owner := min(int(sl)/(16384/3), 2) // StartCluster's even split
	target := nodes[(owner+1)%3]
	targetID, err := target.Client().ClusterMyID(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	// The new owner first (it bumps its config epoch as it takes the
	// slot), then the old one and the third; and the move is awaited on
	// every node: a node that gossip had not yet told could send the
	// store's retry back to the old owner (seen once: MOVED to it).
	order := []int{(owner + 1) % 3, owner, (owner + 2) % 3}
	for _, k := range order {
		if err := nodes[k].Client().Do(ctx, "CLUSTER", "SETSLOT", sl, "NODE", targetID).Err(); err != nil {
			t.Fatalf("SETSLOT on %s: %v", nodes[k].Addr(), err)
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	for _, n := range nodes {
		for {
			err := n.Client().Get(ctx, key).Err()
			addr, moved := redis.IsMovedError(err)
			if n == target && !moved || moved && addr == target.Addr() {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s does not send slot %d to %s after 10 s: %v", n.Addr(), sl, target.Addr(), err)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	r, err := s.Evaluate(ctx, []limit.Check{{Key: key, Limit: 5, WindowUS: 3600e6, Hits: 1}})
	if err != nil || r[0].Used(5) != 1 {
		t.Fatalf("after the slot moved: %+v, %v", r, err)
	}
	if n, err := target.Client().Exists(ctx, key).Result(); err != nil || n != 1 {
		t.Errorf("key not on the slot's new owner %s: %v %v", target.Addr(), n, err)
	}
}

// TestClusterNodePaused freezes one master under concurrent load: calls
// for the other masters keep being decided at once, never held behind the
// frozen one (batches are per node), and calls for the frozen one fail by
// their deadline.
func TestClusterNodePaused(t *testing.T) {
	// The breaker stays out of the way: this is about batching.
	nodes, s := clusterStore(t, func(o *redisstore.Options) { o.Timeout, o.BreakerFailures = 300*time.Millisecond, 1<<20 })
	ctx := context.Background()
	keys := clusterKeys(t, nodes, fmt.Sprint("hol", time.Now().UnixNano()), 3)
	sl, err := nodes[0].Client().ClusterKeySlot(ctx, keys[0]).Result()
	if err != nil {
		t.Fatal(err)
	}
	frozen := nodes[min(int(sl)/(16384/3), 2)]
	frozen.Pause()
	defer frozen.Resume()

	var mu sync.Mutex
	var healthy []time.Duration
	var healthyErrs, frozenOK atomic.Int64
	var wg sync.WaitGroup
	end := time.Now().Add(1500 * time.Millisecond)
	for g := range 24 {
		wg.Go(func() {
			for i := 0; time.Now().Before(end); i++ {
				key := keys[(g+i)%3]
				start := time.Now()
				_, err := s.Evaluate(ctx, []limit.Check{{Key: key, Limit: 1 << 30, WindowUS: 3600e6, Hits: 1}})
				took := time.Since(start)
				if key == keys[0] {
					if err == nil {
						frozenOK.Add(1)
					}
					continue
				}
				if err != nil {
					healthyErrs.Add(1)
					continue
				}
				mu.Lock()
				healthy = append(healthy, took)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	slices.Sort(healthy)
	if len(healthy) == 0 {
		t.Fatal("no call for a healthy master was decided")
	}
	p99 := healthy[len(healthy)*99/100]
	t.Logf("one master frozen: %d calls on the others, p50 %v p99 %v, %d failed; %d calls on the frozen one answered",
		len(healthy), healthy[len(healthy)/2], p99, healthyErrs.Load(), frozenOK.Load())
	if healthyErrs.Load() > 0 || p99 > 150*time.Millisecond {
		t.Errorf("calls for healthy masters held behind the frozen one: %d failed, p99 %v (timeout 300ms)", healthyErrs.Load(), p99)
	}
	if frozenOK.Load() > 0 {
		t.Errorf("%d calls for the frozen master were answered", frozenOK.Load())
	}
}

// TestClusterLeases: leased counters on three masters, three in each
// request: grants are taken per slot and used in process, and exactly
// the limit is admitted.
func TestClusterLeases(t *testing.T) {
	redistest.AwayFromHourEnd(10 * time.Second) // the counters are per hour
	reg := prometheus.NewRegistry()
	nodes, rs := clusterStore(t, func(o *redisstore.Options) { o.Metrics = redisstore.NewMetrics(reg) })
	m := lease.NewMetrics(reg)
	s := lease.New(rs, lease.Options{Interval: 20 * time.Millisecond, Timeout: time.Second, Metrics: m})
	defer s.Close()
	keys := clusterKeys(t, nodes, "leased", 3)
	var checks []limit.Check
	for _, k := range keys {
		checks = append(checks, limit.Check{Key: k, Limit: 300, WindowUS: 3600e6, Hits: 1, Lease: true})
	}
	var admitted, failed atomic.Int64
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 100 {
				r, err := s.Evaluate(context.Background(), checks)
				switch {
				case err != nil:
					failed.Add(1)
				case !r[0].Over && !r[1].Over && !r[2].Over:
					admitted.Add(1)
				}
				time.Sleep(time.Millisecond)
			}
		})
	}
	wg.Wait()
	local := testutil.ToFloat64(m.LeaseDecisions.WithLabelValues("local"))
	if admitted.Load() != 300 || failed.Load() != 0 || local < 50 {
		t.Errorf("admitted %d of 800 (%d failed, %.0f in process); want exactly 300, grants in use", admitted.Load(), failed.Load(), local)
	}
}
