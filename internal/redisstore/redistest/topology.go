package redistest

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// StartTLS runs a redis-server that accepts only TLS connections with
// certificates from certs, requiring client certificates.
func StartTLS(t testing.TB, certs *Certs, args ...string) *Server {
	t.Helper()
	return StartWith(t, Auth{Certs: certs}, args...)
}

// ClusterURL returns a redis:// URL naming every node, for go-redis's
// ParseClusterURL.
func ClusterURL(nodes []*Server) string {
	var b strings.Builder
	b.WriteString("redis://" + nodes[0].Addr())
	for i, n := range nodes[1:] {
		if i == 0 {
			b.WriteString("?")
		} else {
			b.WriteString("&")
		}
		b.WriteString("addr=" + n.Addr())
	}
	return b.String()
}

// StartCluster runs n masters as one Redis Cluster, the slots split
// evenly, and waits until every node reports cluster_state:ok.
func StartCluster(t testing.TB, n int) []*Server { return StartClusterWith(t, n, Auth{}) }

// StartClusterWith runs a cluster as StartCluster, its nodes requiring
// auth.
func StartClusterWith(t testing.TB, n int, auth Auth) []*Server {
	t.Helper()
	nodes := startClusterNodes(t, n, auth)
	ctx := context.Background()
	per := 16384 / n
	for i, s := range nodes {
		lo, hi := i*per, (i+1)*per-1
		if i == n-1 {
			hi = 16383
		}
		c := s.Client()
		if err := c.Do(ctx, "CLUSTER", "ADDSLOTSRANGE", lo, hi).Err(); err != nil {
			t.Fatalf("redistest: ADDSLOTSRANGE on %s: %v", s.Addr(), err)
		}
		if i > 0 {
			if err := c.Do(ctx, "CLUSTER", "MEET", "127.0.0.1", nodes[0].Port, nodes[0].busPort).Err(); err != nil {
				t.Fatalf("redistest: CLUSTER MEET: %v", err)
			}
		}
	}
	awaitClusterOK(t, nodes, n)
	return nodes
}

// startClusterNodes starts n cluster-enabled servers, each its own
// cluster yet.
func startClusterNodes(t testing.TB, n int, auth Auth) []*Server {
	t.Helper()
	nodes := make([]*Server, n)
	for i := range nodes {
		s := newServer(t, auth, "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf", "--cluster-node-timeout", "2000")
		s.busPort = freePort(t)
		s.start()
		t.Cleanup(s.Kill)
		nodes[i] = s
	}
	return nodes
}

// awaitClusterOK waits until every node of nodes reports cluster_state:ok
// and knows known nodes.
func awaitClusterOK(t testing.TB, nodes []*Server, known int) {
	t.Helper()
	ctx := context.Background()
	deadline := time.Now().Add(20 * time.Second)
	for _, s := range nodes {
		c := s.Client()
		for {
			info, err := c.ClusterInfo(ctx).Result()
			if err == nil && strings.Contains(info, "cluster_state:ok") && strings.Contains(info, fmt.Sprintf("cluster_known_nodes:%d", known)) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("redistest: cluster not ok after 20s: %v %s", err, info)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
}

// Cluster is a Redis Cluster of masters with a replica each:
// Replicas[i] replicates Masters[i].
type Cluster struct {
	Masters, Replicas []*Server
}

// StartReplicatedCluster runs n masters as one Redis Cluster (the slots
// split as StartCluster splits them), and a replica of each, and waits
// until every node reports cluster_state:ok and each replica is in sync.
func StartReplicatedCluster(t testing.TB, n int) *Cluster {
	t.Helper()
	c := &Cluster{Masters: StartCluster(t, n), Replicas: startClusterNodes(t, n, Auth{})}
	ctx := context.Background()
	for i, r := range c.Replicas {
		rc := r.Client()
		if err := rc.Do(ctx, "CLUSTER", "MEET", "127.0.0.1", c.Masters[0].Port, c.Masters[0].busPort).Err(); err != nil {
			t.Fatalf("redistest: CLUSTER MEET: %v", err)
		}
		id, err := c.Masters[i].Client().Do(ctx, "CLUSTER", "MYID").Text()
		if err != nil {
			t.Fatalf("redistest: CLUSTER MYID: %v", err)
		}
		// The replica must know its master before it may replicate it.
		deadline := time.Now().Add(20 * time.Second)
		for {
			err := rc.Do(ctx, "CLUSTER", "REPLICATE", id).Err()
			if err == nil {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("redistest: CLUSTER REPLICATE on %s: %v", r.Addr(), err)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	awaitClusterOK(t, append(slices.Clone(c.Masters), c.Replicas...), 2*n)
	for _, r := range c.Replicas {
		awaitField(t, r, "master_link_status:up", 20*time.Second)
	}
	return c
}

// URL returns a redis:// URL naming the masters (go-redis learns the
// replicas from them).
func (c *Cluster) URL() string { return ClusterURL(c.Masters) }

// MasterOf returns the index of the master that owned slot at the start.
func (c *Cluster) MasterOf(slot int) int { return min(slot/(16384/len(c.Masters)), len(c.Masters)-1) }

// AwaitPromotion waits until replica i is a master that the Cluster
// reports ok (its master killed: the Cluster fails it over after the
// node timeout), forcing the failover with CLUSTER FAILOVER TAKEOVER
// when it has not come after force.
func (c *Cluster) AwaitPromotion(t testing.TB, i int, force, within time.Duration) {
	t.Helper()
	r := c.Replicas[i]
	start := time.Now()
	forced := false
	for !r.has("role:master") {
		if !forced && time.Since(start) > force {
			forced = true
			_ = r.Client().Do(context.Background(), "CLUSTER", "FAILOVER", "TAKEOVER").Err()
		}
		if time.Since(start) > within {
			t.Fatalf("redistest: replica %s not promoted after %v", r.Addr(), within)
		}
		time.Sleep(50 * time.Millisecond)
	}
	awaitField(t, r, "", within)
}

// has reports that s's INFO (replication, or the Cluster's with field
// "cluster_state") holds field.
func (s *Server) has(field string) bool {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	c := redis.NewClient(&redis.Options{Addr: s.Addr(), MaxRetries: -1, TLSConfig: s.tls, Password: s.password})
	defer c.Close()
	var text string
	var err error
	if strings.HasPrefix(field, "cluster_") {
		text, err = c.ClusterInfo(ctx).Result()
	} else {
		text, err = c.Info(ctx, "replication").Result()
	}
	return err == nil && strings.Contains(text, field)
}

// awaitField waits until s has field (empty: cluster_state:ok).
func awaitField(t testing.TB, s *Server, field string, within time.Duration) {
	t.Helper()
	if field == "" {
		field = "cluster_state:ok"
	}
	deadline := time.Now().Add(within)
	for !s.has(field) {
		if time.Now().After(deadline) {
			t.Fatalf("redistest: %s has no %q after %v", s.Addr(), field, within)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Sentinel is a master, its replica and three sentinels watching them.
type Sentinel struct {
	Master, Replica *Server
	Sentinels       []*Server
	// Name is the monitored master's name.
	Name string
}

// URL returns a redis:// URL for go-redis's ParseFailoverURL.
func (s *Sentinel) URL() string {
	return fmt.Sprintf("redis://%s?master_name=%s&addr=%s&addr=%s", s.Sentinels[0].Addr(), s.Name, s.Sentinels[1].Addr(), s.Sentinels[2].Addr())
}

// StartSentinel runs a master, a replica of it, and three sentinels with a
// quorum of 2 that fail over a second after the master stops answering.
func StartSentinel(t testing.TB) *Sentinel { return StartSentinelWith(t, Auth{}) }

// StartSentinelWith runs a master, its replica and sentinels as
// StartSentinel, the master and replica requiring auth (the sentinels
// speak TLS under auth's Certs, and need no password of their own).
func StartSentinelWith(t testing.TB, auth Auth) *Sentinel {
	t.Helper()
	return startSentinel(t, auth, nil)
}

// StartSentinelLinked runs a master, a replica and sentinels as
// StartSentinel, the replica reading its master through a Link: held, it
// lags; cut with the master killed, what it had not read is lost, as in
// a real failover.
func StartSentinelLinked(t testing.TB) (*Sentinel, *Link) {
	t.Helper()
	var link *Link
	st := startSentinel(t, Auth{}, func(master *Server) int {
		link = NewLink(t, master.Addr())
		return link.Port
	})
	return st, link
}

// startSentinel starts the set; via, when set, returns the port the
// replica reaches its master on.
func startSentinel(t testing.TB, auth Auth, via func(*Server) int) *Sentinel {
	t.Helper()
	st := &Sentinel{Name: "rlmaster"}
	st.Master = StartWith(t, auth)
	port, failoverTimeout := st.Master.Port, 5000
	if via != nil {
		port = via(st.Master)
		// A sentinel points a replica whose master is elsewhere than the
		// one it monitors (the link) back at it once failover-timeout
		// has passed (+fix-slave-config), which would bypass the link;
		// the timeout only bounds a failover's steps, it does not slow
		// one.
		failoverTimeout = 600_000
	}
	st.Replica = StartWith(t, auth, "--replicaof", "127.0.0.1", fmt.Sprint(port))
	for range 3 {
		dir := t.TempDir()
		conf := filepath.Join(dir, "sentinel.conf")
		body := fmt.Sprintf("sentinel monitor %s 127.0.0.1 %d 2\nsentinel down-after-milliseconds %[1]s 1000\nsentinel failover-timeout %[1]s %d\nsentinel parallel-syncs %[1]s 1\n", st.Name, st.Master.Port, failoverTimeout) +
			auth.sentinelLines(st.Name)
		if err := os.WriteFile(conf, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		s := &Server{t: t, bin: Binary(t), dir: dir, Port: freePort(t), sentinelConf: conf, args: auth.tlsArgs()}
		if auth.Certs != nil {
			s.tls = auth.Certs.ClientTLS()
		}
		s.start()
		t.Cleanup(s.Kill)
		st.Sentinels = append(st.Sentinels, s)
	}
	// Wait until the replica is in sync and the sentinels know it.
	ctx := context.Background()
	deadline := time.Now().Add(20 * time.Second)
	for {
		info, _ := st.Replica.Client().Info(ctx, "replication").Result()
		known, _ := st.Sentinels[0].Client().Do(ctx, "SENTINEL", "REPLICAS", st.Name).Slice()
		if strings.Contains(info, "master_link_status:up") && len(known) == 1 {
			return st
		}
		if time.Now().After(deadline) {
			t.Fatalf("redistest: sentinel setup not ready after 20s: %s", info)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// MasterAddr asks a sentinel which address is the master now.
func (s *Sentinel) MasterAddr(ctx context.Context) (string, error) {
	addr, err := s.Sentinels[0].Client().Do(ctx, "SENTINEL", "GET-MASTER-ADDR-BY-NAME", s.Name).StringSlice()
	if err != nil || len(addr) != 2 {
		return "", fmt.Errorf("get-master-addr-by-name: %v %v", addr, err)
	}
	return addr[0] + ":" + addr[1], nil
}

// AwaitFailover waits until the sentinels name a master other than old
// and returns it. A linked set's sentinels run with a failover-timeout
// of ten minutes (see startSentinel), so an attempt that fails (an
// election split on a busy machine) would be tried again only after
// twenty: past force without a new master, AwaitFailover asks a
// sentinel for the failover, as an operator would, and logs the
// sentinels' logs. Past within it fails the test with them.
func (s *Sentinel) AwaitFailover(t testing.TB, old string, force, within time.Duration) string {
	t.Helper()
	ctx := context.Background()
	start := time.Now()
	forced := false
	for {
		if a, err := s.MasterAddr(ctx); err == nil && a != old {
			return a
		}
		if !forced && time.Since(start) > force {
			forced = true
			var answers []string
			for _, sn := range s.Sentinels {
				err := sn.Client().Do(ctx, "SENTINEL", "FAILOVER", s.Name).Err()
				answers = append(answers, fmt.Sprintf("%s: %v", sn.Addr(), err))
				if err == nil {
					break
				}
			}
			t.Logf("redistest: no failover %v after the master stopped; asked for one (%s)\n%s", force, strings.Join(answers, "; "), s.logs())
		}
		if time.Since(start) > within {
			t.Fatalf("redistest: no failover within %v\n%s", within, s.logs())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// logs returns the tail of each sentinel's log.
func (s *Sentinel) logs() string {
	var b strings.Builder
	for _, sn := range s.Sentinels {
		log, _ := os.ReadFile(filepath.Join(sn.dir, "redis.log"))
		fmt.Fprintf(&b, "--- sentinel %s\n%s\n", sn.Addr(), tail(string(log)))
	}
	return b.String()
}
