package redistest

import (
	"math/rand/v2"
	"net"
	"sync"
	"testing"
	"time"
)

// WAN is a TCP proxy that puts a wide-area network between a client and
// a server on loopback: each direction is delayed by a one-way latency
// plus a random jitter, in order (TCP never reorders), and the link can
// be partitioned (nothing passes either way, connections stay open, as
// when packets are dropped: callers wait on their own timeouts) and
// healed (what was sent meanwhile is delivered, as TCP's retransmissions
// would). Three regions and their home run on one machine so.
type WAN struct {
	ln   net.Listener
	to   string
	done chan struct{}

	mu          sync.Mutex
	cond        *sync.Cond
	oneWay, jit time.Duration
	parted      bool
	closed      bool
	conns       []net.Conn
	rng         *rand.Rand
}

// NewWAN proxies a free loopback port to addr with the round trip rtt
// (half each way) and up to jitter more each way, until the test ends.
func NewWAN(t testing.TB, addr string, rtt, jitter time.Duration) *WAN {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	w := &WAN{ln: ln, to: addr, done: make(chan struct{}), oneWay: rtt / 2, jit: jitter, rng: rand.New(rand.NewPCG(1, 2))}
	w.cond = sync.NewCond(&w.mu)
	go w.accept()
	t.Cleanup(w.Close)
	return w
}

// Addr is the proxy's address: the server as the client reaches it.
func (w *WAN) Addr() string { return w.ln.Addr().String() }

// URL is the Redis URL of the server behind the proxy.
func (w *WAN) URL() string { return "redis://" + w.Addr() }

// SetLatency changes the round trip and jitter of what is sent from now.
func (w *WAN) SetLatency(rtt, jitter time.Duration) {
	w.mu.Lock()
	w.oneWay, w.jit = rtt/2, jitter
	w.mu.Unlock()
}

// Partition stops everything passing, both ways, until Heal.
func (w *WAN) Partition() {
	w.mu.Lock()
	w.parted = true
	w.mu.Unlock()
}

// Heal lets everything pass again, what waited first.
func (w *WAN) Heal() {
	w.mu.Lock()
	w.parted = false
	w.cond.Broadcast()
	w.mu.Unlock()
}

// Close closes the proxy and every connection through it.
func (w *WAN) Close() {
	w.mu.Lock()
	if w.closed {
		w.mu.Unlock()
		return
	}
	w.closed = true
	close(w.done)
	conns := w.conns
	w.cond.Broadcast()
	w.mu.Unlock()
	_ = w.ln.Close()
	for _, c := range conns {
		_ = c.Close()
	}
}

func (w *WAN) accept() {
	for {
		c, err := w.ln.Accept()
		if err != nil {
			return
		}
		s, err := net.Dial("tcp", w.to)
		if err != nil {
			_ = c.Close()
			continue
		}
		w.mu.Lock()
		if w.closed {
			w.mu.Unlock()
			_ = c.Close()
			_ = s.Close()
			return
		}
		w.conns = append(w.conns, c, s)
		w.mu.Unlock()
		go w.pipe(c, s)
		go w.pipe(s, c)
	}
}

// chunk is what one read brought, and when it may be written on.
type chunk struct {
	b  []byte
	at time.Time
}

// pipe carries src to dst: a reader stamps each read with its delivery
// time (never before the one before it), a writer waits for it and for
// the partition to heal.
func (w *WAN) pipe(src, dst net.Conn) {
	q := make(chan chunk, 1024)
	go func() {
		defer close(q)
		var last time.Time
		for {
			buf := make([]byte, 32<<10)
			n, err := src.Read(buf)
			if n > 0 {
				at := time.Now().Add(w.delay())
				if at.Before(last) {
					at = last
				}
				last = at
				select {
				case q <- chunk{buf[:n], at}:
				case <-w.done:
					return
				}
			}
			if err != nil {
				return
			}
		}
	}()
	defer dst.Close()
	for c := range q {
		if d := time.Until(c.at); d > 0 {
			select {
			case <-time.After(d):
			case <-w.done:
				return
			}
		}
		if !w.waitHealed() {
			return
		}
		if _, err := dst.Write(c.b); err != nil {
			return
		}
	}
}

// delay is one way's latency for what is read now.
func (w *WAN) delay() time.Duration {
	w.mu.Lock()
	defer w.mu.Unlock()
	d := w.oneWay
	if w.jit > 0 {
		d += time.Duration(w.rng.Int64N(int64(w.jit) + 1))
	}
	return d
}

// waitHealed waits while the link is partitioned; false once closed.
func (w *WAN) waitHealed() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	for w.parted && !w.closed {
		w.cond.Wait()
	}
	return !w.closed
}
