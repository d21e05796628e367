package redistest

import (
	"fmt"
	"net"
	"sync"
	"testing"
)

// Link is a TCP proxy to a server that a test can hold: while held, what
// the server sends is not passed on (it waits in the proxy), so a replica
// behind a Link lags its master by as much as the test wants; Cut drops
// what waits and closes every connection, as a master killed before its
// replica read its last writes.
type Link struct {
	// Port is the proxy's loopback port.
	Port int
	to   string
	ln   net.Listener

	mu    sync.Mutex
	cond  *sync.Cond
	held  bool
	drop  bool
	cut   bool
	conns []net.Conn
}

// NewLink proxies a free loopback port to addr until the test ends.
func NewLink(t testing.TB, addr string) *Link {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := &Link{Port: ln.Addr().(*net.TCPAddr).Port, to: addr, ln: ln}
	l.cond = sync.NewCond(&l.mu)
	go l.accept(ln)
	t.Cleanup(l.close)
	return l
}

func (l *Link) accept(ln net.Listener) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		s, err := net.Dial("tcp", l.to)
		if err != nil {
			_ = c.Close()
			continue
		}
		l.mu.Lock()
		l.conns = append(l.conns, c, s)
		l.mu.Unlock()
		go l.pipe(c, s, false)
		go l.pipe(s, c, true)
	}
}

// pipe copies src to dst; from the server, it waits while the link is
// held.
func (l *Link) pipe(src, dst net.Conn, fromServer bool) {
	defer dst.Close()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			l.mu.Lock()
			for fromServer && l.held && !l.cut {
				l.cond.Wait()
			}
			cut, drop := l.cut, !fromServer && l.drop
			l.mu.Unlock()
			if cut {
				return
			}
			if drop {
				continue
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// Hold stops passing on what the server sends.
func (l *Link) Hold() {
	l.mu.Lock()
	l.held = true
	l.mu.Unlock()
}

// Release passes on what waited, and what comes.
func (l *Link) Release() {
	l.mu.Lock()
	l.held = false
	l.cond.Broadcast()
	l.mu.Unlock()
}

// DropRequests discards what clients send, keeping their connections
// open: a request the network loses, with no error either side sees.
// PassRequests ends it.
func (l *Link) DropRequests() { l.setDrop(true) }

// PassRequests passes what clients send again.
func (l *Link) PassRequests() { l.setDrop(false) }

func (l *Link) setDrop(drop bool) {
	l.mu.Lock()
	l.drop = drop
	l.mu.Unlock()
}

// Cut drops what waits and closes every connection through the link; new
// ones are refused.
func (l *Link) Cut() {
	l.mu.Lock()
	l.cut = true
	l.cond.Broadcast()
	conns, ln := l.conns, l.ln
	l.conns = nil
	l.mu.Unlock()
	_ = ln.Close()
	for _, c := range conns {
		_ = c.Close()
	}
}

func (l *Link) close() { l.Cut() }

// String names the link for test messages.
func (l *Link) String() string { return fmt.Sprintf("link 127.0.0.1:%d -> %s", l.Port, l.to) }

// Restore opens a cut link again on its port: new connections pass, as
// when a network comes back.
func (l *Link) Restore(t testing.TB) {
	t.Helper()
	ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", l.Port))
	if err != nil {
		t.Fatalf("redistest: restore %s: %v", l, err)
	}
	l.mu.Lock()
	l.ln, l.cut, l.held = ln, false, false
	l.mu.Unlock()
	go l.accept(ln)
}
