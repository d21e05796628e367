package main

import (
	"net"
	"sync"
	"testing"
)

func freeAddr(t *testing.T) string {
	t.Helper()
	for {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := l.Addr().String()
		l.Close()
		// The kernel may hand a port just closed out again: two flags
		// of one server given the same port would collide (seen:
		// --grpc-addr and --debug-addr both on one port).
		handedMu.Lock()
		seen := handed[addr]
		handed[addr] = true
		handedMu.Unlock()
		if !seen {
			return addr
		}
	}
}

// handed are the addresses freeAddr gave out in this test binary.
var (
	handedMu sync.Mutex
	handed   = map[string]bool{}
)
