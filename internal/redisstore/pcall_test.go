package redisstore

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/internal/limit"
	"github.com/ratelimitd/ratelimitd/internal/redisstore/redistest"
)

// TestScriptErrorStaysWithItsRequest: with min-replicas-to-write 1 and no
// replica, Redis refuses writes, not reads. One script call holding a
// check-only request, a writing request, another check-only request and
// a writing request of two keys fails only the writing ones: the script
// ends each request's Redis error instead of failing the whole call (the
// one-key fast path by redis.pcall, the general path by pcall), and the
// requests around them are decided.
func TestScriptErrorStaysWithItsRequest(t *testing.T) {
	srv := redistest.Start(t, "--min-replicas-to-write", "1")
	s, err := New(Options{URL: srv.URL(), Timeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	peek := []limit.Check{{Key: "peek", Limit: 5, WindowUS: 3600e6}}
	write := []limit.Check{{Key: "write", Limit: 5, WindowUS: 3600e6, Hits: 1}}
	write2 := []limit.Check{{Key: "w1", Limit: 5, WindowUS: 3600e6, Hits: 1}, {Key: "w2", Limit: 5, WindowUS: 60e6, Hits: 1}}
	vals, err := s.run(context.Background(), [][]limit.Check{peek, write, peek, write2})
	if err != nil {
		t.Fatalf("the whole call failed: %v", err)
	}
	for i, tt := range []struct {
		k0      int
		wantErr string
	}{{0, ""}, {1, "NOREPLICAS"}, {2, ""}, {3, "NOREPLICAS"}} {
		part, err := splitReply(vals, tt.k0, 1)
		switch {
		case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
			t.Errorf("request %d: %v, %v; want %s", i, part, err, tt.wantErr)
		case tt.wantErr == "" && err != nil:
			t.Errorf("request %d failed with its neighbour: %v", i, err)
		case tt.wantErr == "" && (part[0] != int64(0) || part[1] != int64(5)):
			t.Errorf("request %d: %v, want not over with 5 remaining", i, part)
		}
	}
}
