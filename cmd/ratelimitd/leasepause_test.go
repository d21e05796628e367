package main

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os/exec"
	"runtime"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/ratelimitd/ratelimitd/internal/redisstore/redistest"
	"github.com/ratelimitd/ratelimitd/internal/starve"
)

// A pause property test's knobs: one-second windows of leasePauseLimit
// on each of leasePauseKeys counters, offered 0.7 and 3 times that in
// turn (pauseKey), until leasePauseWindows counter-windows were asked more than the limit
// (at most leasePauseRun).
const (
	leasePauseLimit   = 40
	leasePauseKeys    = 10
	leasePauseWindows = 200
	leasePauseRun     = 150 * time.Second
	// pauseOffered is the calls a second of all callers together, when
	// none is held up: half the counters at 3x the limit, half at 0.7x.
	pauseOffered = leasePauseKeys / 2 * (3*leasePauseLimit + 7*leasePauseLimit/10)
	// pauseCallers is how many callers each instance has.
	pauseCallers = 8
)

// TestLeasePausedHolders: three instances hold grants of ten leased
// counters (40 a one-second window each, offered 0.7x and 3x in turn)
// while each is stopped and continued (SIGSTOP, SIGCONT) for 10-500 ms
// at random moments, half of them just before a window ends, and Redis's
// answers to them are held up as long at other moments (a proxy), so
// that grants, give-backs and decisions arrive late; the machine is kept
// busy by a loop a core. Every counter's window admits at most its limit, over at
// least 200 windows where more than the limit was asked. An admission is
// put in the window of its decision, made between sending and answer;
// one whose call spanned a window's end may be in either (unless the
// reset_us of --decision-metadata rules out the first), and the test
// looks for a placement that keeps every window within the limit. The
// seed is logged.
func TestLeasePausedHolders(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	srv := redistest.Start(t)
	rules := writeRules(t, fmt.Sprintf(`domain: pause
descriptors:
  - key: k
    failure_mode: deny
    rate_limit: {unit: second, requests_per_unit: %d, lease: true}
`, leasePauseLimit))
	starve.Loops(t, runtime.NumCPU())
	proxy := holdingProxy(t, srv.Addr())

	type holder struct {
		cmd    *exec.Cmd
		client rlsv3.RateLimitServiceClient
	}
	var holders []holder
	for _, interval := range []string{"50ms", "100ms", "200ms"} {
		grpcAddr, httpAddr := freeAddr(t), freeAddr(t)
		// A second for Redis: a held answer is late, not lost.
		cmd := mainCommand(t, "--config", rules, "--redis-url", "redis://"+proxy.addr, "--redis-timeout", "1s",
			"--grpc-addr", grpcAddr, "--http-addr", httpAddr, "--lease-interval", interval, "--decision-metadata")
		var out syncBuffer
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			cmd.Process.Signal(syscall.SIGCONT)
			cmd.Process.Kill()
			cmd.Wait()
		})
		getWithin(t, "http://"+httpAddr+"/healthcheck", &out)
		holders = append(holders, holder{cmd, rlsv3.NewRateLimitServiceClient(dial(t, grpcAddr))})
	}

	ctx, cancel := context.WithTimeout(context.Background(), leasePauseRun)
	defer cancel()
	var mu sync.Mutex
	var calls []pausedCall
	var wg sync.WaitGroup
	wg.Go(func() {
		atRandom(ctx, rand.New(rand.NewPCG(seed, 99)), proxy.hold)
	})
	for h, hd := range holders {
		wg.Go(func() {
			atRandom(ctx, rand.New(rand.NewPCG(seed, uint64(h))), func(d time.Duration) {
				hd.cmd.Process.Signal(syscall.SIGSTOP)
				time.Sleep(d)
				hd.cmd.Process.Signal(syscall.SIGCONT)
			})
		})
		for g := range pauseCallers {
			rng := rand.New(rand.NewPCG(seed, uint64(100+10*h+g)))
			wg.Go(func() {
				// Paced, not as fast as the machine allows: the counters'
				// demand is what pauseKey says on any machine.
				every := 3 * pauseCallers * time.Second / pauseOffered
				next := time.Now()
				for ctx.Err() == nil {
					c := askPaused(t, hd.client, h, pauseKey(rng))
					mu.Lock()
					calls = append(calls, c)
					mu.Unlock()
					next = later(next.Add(every), time.Now())
					time.Sleep(time.Until(next))
				}
			})
		}
	}
	// Run until enough windows were asked more than the limit: a busy
	// machine sends fewer calls a second.
	for ctx.Err() == nil {
		time.Sleep(2 * time.Second)
		mu.Lock()
		_, demanded := countPaused(calls)
		mu.Unlock()
		if demanded >= leasePauseWindows+2*leasePauseKeys {
			cancel()
		}
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	checkPausedWindows(t, calls)
}

// pauseKey draws a counter to call: each asks about 3 times the limit
// in one window (exhausted early, the tail decided hit by hit) and 0.7
// in the next (grants still in hand when it ends), half the counters
// each way at a time, with the calls the test makes.
func pauseKey(rng *rand.Rand) int {
	odd := int(time.Now().Unix() % 2)
	n := rng.IntN(leasePauseKeys / 2 * (30 + 7)) // weights 30 and 7
	for k := range leasePauseKeys {
		w := 7
		if k%2 == odd {
			w = 30
		}
		if n < w {
			return k
		}
		n -= w
	}
	return 0
}

// pausedCall is one ShouldRateLimit call of the pause test: the windows
// (their ends, µs) its decision may be in, and what it answered.
type pausedCall struct {
	holder, key int
	ok          bool
	policy      bool // answered by the failure policy
	ends        []int64
}

// askPaused makes one call and places it in the windows its decision
// may be in.
func askPaused(t *testing.T, c rlsv3.RateLimitServiceClient, holder, key int) pausedCall {
	cctx, ccancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer ccancel()
	sent := time.Now().UnixMicro()
	r, err := c.ShouldRateLimit(cctx, &rlsv3.RateLimitRequest{Domain: "pause",
		Descriptors: []*rlcommon.RateLimitDescriptor{desc("k", fmt.Sprint(key))}})
	got := time.Now().UnixMicro()
	call := pausedCall{holder: holder, key: key}
	if err != nil {
		// A call without an answer may have been admitted: the test
		// could no longer tell a window's count.
		t.Errorf("holder %d: %v", holder, err)
		return call
	}
	call.ok = r.GetOverallCode() == rlsv3.RateLimitResponse_OK
	ds, _ := r.GetDynamicMetadata().AsMap()["decisions"].([]any)
	d, _ := ds[0].(map[string]any)
	reason, _ := d["reason"].(string)
	call.policy = reason == "fail_open" || reason == "fail_closed"
	reset, isNum := d["reset_us"].(float64)
	if !isNum {
		if !call.policy {
			t.Errorf("holder %d: a decision without reset_us: %v", holder, d)
		}
		return call
	}
	call.ends = decisionEnds(sent, got, reset)
	if len(call.ends) == 0 {
		t.Errorf("holder %d: reset_us %v names a window that ended before the call (%d..%d)", holder, reset, sent, got)
	}
	return call
}

// decisionEnds returns the ends (µs) of the one-second windows a decision
// answered with reset µs to its window's end may have been made in: it
// was made between sending (sent) and answer (got), in the window
// holding that moment (whole seconds of Redis's clock, this machine's;
// 5 ms either side for the clocks' reading). Its reset is exact from
// Redis and early from a grant (counted from when the grant was asked
// for), so the window ends no sooner than it says.
func decisionEnds(sent, got int64, reset float64) []int64 {
	const second, slack = int64(1_000_000), int64(5_000)
	var ends []int64
	for end := (sent-slack)/second*second + second; end-second < got+slack; end += second {
		if end >= sent+int64(reset)-slack {
			ends = append(ends, end)
		}
	}
	return ends
}

// atRandom calls pause with 10-500 ms until ctx ends, 50-600 ms apart,
// half of the calls 0-30 ms before a window ends.
func atRandom(ctx context.Context, rng *rand.Rand, pause func(time.Duration)) {
	for {
		wait := time.Duration(50+rng.IntN(550)) * time.Millisecond
		if rng.IntN(2) == 0 {
			now := time.Now()
			wait = now.Truncate(time.Second).Add(time.Second).Sub(now) - time.Duration(rng.IntN(30))*time.Millisecond
			if wait < 0 {
				wait += time.Second
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
		pause(time.Duration(10+rng.IntN(490)) * time.Millisecond)
	}
}

// proxy passes TCP connections to a server, and holds up what the server
// answers when told to.
type proxy struct {
	addr  string
	until atomic.Int64 // Unix ns: answers wait until then
}

// hold keeps the server's answers from the clients for d, from now.
func (p *proxy) hold(d time.Duration) {
	p.until.Store(time.Now().Add(d).UnixNano())
	time.Sleep(d)
}

// holdingProxy starts a proxy to target until the test ends.
func holdingProxy(t *testing.T, target string) *proxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{addr: ln.Addr().String()}
	var mu sync.Mutex
	var conns []net.Conn
	var wg sync.WaitGroup
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s, err := net.Dial("tcp", target)
			if err != nil {
				c.Close()
				continue
			}
			mu.Lock()
			conns = append(conns, c, s)
			mu.Unlock()
			wg.Go(func() { io.Copy(s, c); s.Close() })
			wg.Go(func() {
				buf := make([]byte, 64<<10)
				for {
					n, err := s.Read(buf)
					if wait := time.Until(time.Unix(0, p.until.Load())); wait > 0 {
						time.Sleep(wait)
					}
					if n > 0 {
						if _, werr := c.Write(buf[:n]); werr != nil {
							break
						}
					}
					if err != nil {
						break
					}
				}
				c.Close()
			})
		}
	})
	return p
}

// checkPausedWindows holds every counter's windows to the limit: the
// admissions with one possible window counted there, then those that may
// be in either of two placed earliest-deadline-first where room is left
// (a placement within the limit exists if this finds one).
func checkPausedWindows(t *testing.T, calls []pausedCall) {
	admitted, demanded := countPaused(calls)
	var over []string
	for w, n := range admitted {
		if n > leasePauseLimit {
			over = append(over, fmt.Sprintf("key %d, window ending %s: %d", w.key, time.UnixMicro(w.end).Format("15:04:05"), n))
		}
	}
	sort.Strings(over)
	policy, ambiguous := 0, 0
	for _, c := range calls {
		if c.policy {
			policy++
		}
		if c.ok && len(c.ends) > 1 {
			ambiguous++
		}
	}
	t.Logf("%d calls, %d counter-windows asked more than the limit, %d admissions placed in either of two windows, %d answered by the failure policy", len(calls), demanded, ambiguous, policy)
	if len(over) > 0 {
		t.Errorf("%d counter-windows admitted more than %d:\n%v", len(over), leasePauseLimit, over)
	}
	if demanded < leasePauseWindows {
		t.Errorf("only %d counter-windows were asked more than the limit, want at least %d: the property was not exercised", demanded, leasePauseWindows)
	}
}

// counterWindow is one counter's window, by its end (µs).
type counterWindow struct {
	key int
	end int64
}

// countPaused returns the admissions of each counter-window (those that
// may be in either of two placed earliest-deadline-first where room is
// left: a placement within the limit exists if this finds one) and how
// many counter-windows were asked more than the limit.
func countPaused(calls []pausedCall) (map[counterWindow]int, int) {
	admitted, asked := map[counterWindow]int{}, map[counterWindow]int{}
	var ambiguous []pausedCall
	for _, c := range calls {
		if len(c.ends) == 0 {
			continue
		}
		asked[counterWindow{c.key, c.ends[0]}]++
		switch {
		case !c.ok:
		case len(c.ends) > 1:
			ambiguous = append(ambiguous, c)
		default:
			admitted[counterWindow{c.key, c.ends[0]}]++
		}
	}
	sort.Slice(ambiguous, func(i, j int) bool {
		return ambiguous[i].ends[len(ambiguous[i].ends)-1] < ambiguous[j].ends[len(ambiguous[j].ends)-1]
	})
	for _, c := range ambiguous {
		i := slices.IndexFunc(c.ends, func(end int64) bool { return admitted[counterWindow{c.key, end}] < leasePauseLimit })
		admitted[counterWindow{c.key, c.ends[max(i, 0)]}]++
	}
	demanded := 0
	for _, n := range asked {
		if n > leasePauseLimit {
			demanded++
		}
	}
	return admitted, demanded
}

// later returns the later of a and b: a caller held up sends its next
// call at once, not the ones it missed.
func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}
