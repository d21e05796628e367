// Package redistest starts private redis-server processes for tests, on
// free loopback ports of their own, and stops them when the test ends. It
// never touches a Redis it did not start.
//
// The binary is $RATELIMITD_REDIS_SERVER, else redis-server from PATH. When
// neither exists the test is skipped, unless RATELIMITD_REQUIRE_REDIS=1 (the
// project's test command sets it), which makes a missing Redis a failure.
package redistest

import (
	"bufio"
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// Server is one redis-server process owned by a test.
type Server struct {
	t    testing.TB
	bin  string
	dir  string
	args []string
	// Port is the loopback port it listens on; a restart keeps it.
	Port int
	cmd  *exec.Cmd
	// tls, when set, makes the server listen with TLS only, and Client
	// and the readiness check use it.
	tls *tls.Config
	// sentinelConf, when set, runs the process as a sentinel with it.
	sentinelConf string
	// password is what its clients send as the default user's (Auth).
	password string
	// busPort, when set, is a cluster node's bus port (--cluster-port):
	// chosen free, not the port + 10000 Redis takes by default, which
	// another process may hold.
	busPort int
	// started: it has run once, so a restart keeps its ports.
	started bool
}

// Binary returns the redis-server path, skipping or failing t when there
// is none.
func Binary(t testing.TB) string {
	t.Helper()
	bin := os.Getenv("RATELIMITD_REDIS_SERVER")
	if bin == "" {
		bin, _ = exec.LookPath("redis-server")
	}
	if bin == "" {
		if os.Getenv("RATELIMITD_REQUIRE_REDIS") == "1" {
			t.Fatal("redistest: no redis-server (set RATELIMITD_REDIS_SERVER or install redis-server)")
		}
		t.Skip("redistest: no redis-server; run ./scripts/test.sh")
	}
	return bin
}

// Start runs a fresh redis-server with nothing persisted. Extra args are
// appended to its command line (e.g. "--maxmemory", "1mb").
func Start(t testing.TB, args ...string) *Server {
	t.Helper()
	s := &Server{t: t, bin: Binary(t), dir: t.TempDir(), args: args, Port: freePort(t)}
	s.start()
	t.Cleanup(s.Kill)
	return s
}

// Addr returns host:port.
func (s *Server) Addr() string { return "127.0.0.1:" + strconv.Itoa(s.Port) }

// URL returns a redis:// URL for it.
func (s *Server) URL() string { return "redis://" + s.Addr() }

// Client returns a go-redis client closed at the end of the test.
func (s *Server) Client() *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: s.Addr(), MaxRetries: -1, TLSConfig: s.tls, Password: s.password})
	s.t.Cleanup(func() { c.Close() })
	return c
}

func (s *Server) start() {
	s.t.Helper()
	for attempt := 0; ; attempt++ {
		cmd := exec.Command(s.bin, s.commandLine()...)
		// The server dies with the test binary even if cleanup never runs.
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		if err := cmd.Start(); err != nil {
			s.t.Fatalf("redistest: start %s: %v", s.bin, err)
		}
		s.cmd = cmd
		if err := s.waitReady(5 * time.Second); err == nil {
			s.started = true
			return
		} else if attempt >= 2 {
			log, _ := os.ReadFile(filepath.Join(s.dir, "redis.log"))
			s.t.Fatalf("redistest: redis-server on %d not ready: %v\n%s", s.Port, err, tail(string(log)))
		}
		s.Kill()
		if !s.started {
			// A port found free may be taken by the time Redis binds it
			// (another test's server): a first start tries other ports.
			s.Port = freePort(s.t)
			if s.busPort != 0 {
				s.busPort = freePort(s.t)
			}
		}
	}
}

// commandLine is redis-server's arguments for s.
func (s *Server) commandLine() []string {
	port := []string{"--port", strconv.Itoa(s.Port)}
	if s.tls != nil {
		port = []string{"--port", "0", "--tls-port", strconv.Itoa(s.Port)}
	}
	args := append(append([]string{"--bind", "127.0.0.1"}, port...), "--save", "", "--appendonly", "no",
		"--dir", s.dir, "--daemonize", "no", "--logfile", filepath.Join(s.dir, "redis.log"))
	if s.sentinelConf != "" {
		args = append(append([]string{s.sentinelConf, "--sentinel", "--bind", "127.0.0.1"}, port...),
			"--dir", s.dir, "--daemonize", "no", "--logfile", filepath.Join(s.dir, "redis.log"))
	}
	if s.busPort != 0 {
		args = append(args, "--cluster-port", strconv.Itoa(s.busPort))
	}
	return append(args, s.args...)
}

func (s *Server) waitReady(limit time.Duration) error {
	deadline := time.Now().Add(limit)
	c := redis.NewClient(&redis.Options{Addr: s.Addr(), MaxRetries: -1, DialTimeout: 200 * time.Millisecond, TLSConfig: s.tls, Password: s.password})
	defer c.Close()
	var err error
	for time.Now().Before(deadline) {
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		err = c.Ping(ctx).Err()
		cancel()
		if err == nil {
			return nil
		}
		if s.cmd.ProcessState != nil {
			return fmt.Errorf("exited: %v", s.cmd.ProcessState)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return err
}

// Kill stops the server at once (SIGKILL) and waits for it.
func (s *Server) Kill() {
	if s.cmd == nil || s.cmd.Process == nil {
		return
	}
	_ = s.cmd.Process.Signal(syscall.SIGCONT) // a paused process must be able to die
	_ = s.cmd.Process.Kill()
	_ = s.cmd.Wait()
	s.cmd = nil
}

// Restart starts the server again on the same port, empty.
func (s *Server) Restart() {
	s.t.Helper()
	s.Kill()
	s.start()
}

// Pause freezes the process (SIGSTOP): connections stay open and nothing
// answers, like a hung Redis.
func (s *Server) Pause() { _ = s.cmd.Process.Signal(syscall.SIGSTOP) }

// Resume undoes Pause.
func (s *Server) Resume() { _ = s.cmd.Process.Signal(syscall.SIGCONT) }

// CommandStats returns the calls per command from INFO commandstats,
// keyed by lower-case command name (e.g. "evalsha", "get").
func (s *Server) CommandStats(ctx context.Context) (map[string]int64, error) {
	c := redis.NewClient(&redis.Options{Addr: s.Addr(), MaxRetries: -1, TLSConfig: s.tls, Password: s.password})
	defer c.Close()
	info, err := c.Info(ctx, "commandstats").Result()
	if err != nil {
		return nil, err
	}
	out := map[string]int64{}
	sc := bufio.NewScanner(strings.NewReader(info))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		name, rest, ok := strings.Cut(strings.TrimPrefix(line, "cmdstat_"), ":")
		if !ok || !strings.HasPrefix(line, "cmdstat_") {
			continue
		}
		for _, f := range strings.Split(rest, ",") {
			if v, ok := strings.CutPrefix(f, "calls="); ok {
				out[name], _ = strconv.ParseInt(v, 10, 64)
			}
		}
	}
	return out, nil
}

func freePort(t testing.TB) int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("redistest: free port: %v", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

func tail(s string) string {
	if len(s) > 2000 {
		return s[len(s)-2000:]
	}
	return s
}

// AwayFromHourEnd waits, when the hour ends within d, until it has: a
// test counting admissions on counters of one hour on the real clock
// must not see two windows.
func AwayFromHourEnd(d time.Duration) { AwayFromWindowEnd(time.Hour, d) }

// AwayFromWindowEnd is AwayFromHourEnd for windows of length w (a minute,
// say): it waits out the current window when less than d of it is left.
func AwayFromWindowEnd(w, d time.Duration) {
	if rest := time.Until(time.Now().Truncate(w).Add(w)); rest < d {
		time.Sleep(rest + 10*time.Millisecond)
	}
}
