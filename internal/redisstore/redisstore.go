// Package redisstore decides rate-limit checks in Redis: one EVALSHA of an
// embedded, constant Lua script per request, with "now" read from Redis's
// own clock, increments applied all or nothing, and every key written
// together with its expiry.
package redisstore

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratelimitd/ratelimitd/internal/limit"
)

//go:embed scripts/*.lua
var scriptFS embed.FS

// ErrUnavailable marks every failure to get a decision from Redis: it could
// not be reached in time, or it refused the script (OOM, NOREPLICAS,
// READONLY, LOADING, ...). The service answers such checks by policy.
var ErrUnavailable = errors.New("redisstore: unavailable")

// DefaultTimeout bounds one Evaluate when [Options.Timeout] is zero.
const DefaultTimeout = 50 * time.Millisecond

// Options configures a [Store].
type Options struct {
	// URL is a redis://, rediss:// or unix:// URL, parsed by go-redis.
	URL string
	// Timeout bounds each Evaluate, including waiting for a pooled
	// connection. Zero means [DefaultTimeout]; a shorter deadline on the
	// caller's context always wins.
	Timeout time.Duration
	// ScriptTime, when set, is sent to the script as "now" instead of
	// letting it read Redis TIME. Tests only: it lets them script a
	// timeline. Production leaves it nil.
	ScriptTime func() time.Time
}

// Store is a Redis-backed store. It is safe for concurrent use.
type Store struct {
	client  redis.UniversalClient
	script  *redis.Script
	timeout time.Duration
	now     func() time.Time

	reloads atomic.Int64
}

// New parses the URL and builds the client. It does not wait for Redis: a
// Redis that is down at startup is not an error, a URL that does not parse
// is.
func New(opts Options) (*Store, error) {
	ro, err := redis.ParseURL(opts.URL)
	if err != nil {
		return nil, fmt.Errorf("redisstore: parse --redis-url: %w", err)
	}
	timeout := opts.Timeout
	if timeout <= 0 {
		timeout = DefaultTimeout
	}
	// No retries: a retry after a timeout doubles the wait and replays a
	// script that may already have run. Each command is bounded by the
	// context (ContextTimeoutEnabled) and by the read/write timeouts.
	ro.MaxRetries = -1
	ro.ContextTimeoutEnabled = true
	ro.ReadTimeout = timeout
	ro.WriteTimeout = timeout
	ro.PoolTimeout = timeout
	if ro.DialTimeout == 0 || ro.DialTimeout > time.Second {
		ro.DialTimeout = time.Second
	}
	ro.DisableIdentity = true
	src, err := scriptFS.ReadFile("scripts/decide.lua")
	if err != nil {
		return nil, fmt.Errorf("redisstore: %w", err)
	}
	return &Store{
		client:  redis.NewClient(ro),
		script:  redis.NewScript(string(src)),
		timeout: timeout,
		now:     opts.ScriptTime,
	}, nil
}

// Ping checks that Redis answers and loads the script, so the first
// request does not pay for it.
func (s *Store) Ping(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, s.timeout*4)
	defer cancel()
	if err := s.client.Ping(ctx).Err(); err != nil {
		return fmt.Errorf("redisstore: ping: %w: %w", ErrUnavailable, err)
	}
	if err := s.script.Load(ctx, s.client).Err(); err != nil {
		return fmt.Errorf("redisstore: script load: %w: %w", ErrUnavailable, err)
	}
	return nil
}

// Evaluate decides checks in one script call.
func (s *Store) Evaluate(ctx context.Context, checks []limit.Check) ([]limit.Result, error) {
	if len(checks) == 0 {
		return nil, nil
	}
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	keys := make([]string, len(checks))
	args := make([]any, 1, 1+4*len(checks))
	args[0] = "0"
	if s.now != nil {
		args[0] = strconv.FormatInt(s.now().UnixMicro(), 10)
	}
	for i, c := range checks {
		keys[i] = c.Key
		flags := 0
		if c.Refund {
			flags |= 1
		}
		if c.NoVeto {
			flags |= 2
		}
		args = append(args, c.Limit, c.WindowUS, c.Hits, flags)
	}
	res, err := s.script.EvalSha(ctx, s.client, keys, args...).Result()
	if err != nil && isNoScript(err) {
		s.reloads.Add(1)
		res, err = s.script.Eval(ctx, s.client, keys, args...).Result()
	}
	if err != nil {
		return nil, fmt.Errorf("redisstore: eval decide (%d keys): %w: %w", len(keys), ErrUnavailable, err)
	}
	vals, ok := res.([]any)
	if !ok || len(vals) != 3*len(checks) {
		return nil, fmt.Errorf("redisstore: eval decide (%d keys): unexpected reply %v", len(keys), res)
	}
	out := make([]limit.Result, len(checks))
	for i := range out {
		over, _ := vals[3*i].(int64)
		count, _ := vals[3*i+1].(int64)
		reset, _ := vals[3*i+2].(int64)
		out[i] = limit.Result{Over: over == 1, Count: uint64(count), ResetUS: reset}
	}
	return out, nil
}

// ScriptReloads returns how many times the script had to be sent again
// because Redis had lost it (NOSCRIPT: a restart, SCRIPT FLUSH, failover).
func (s *Store) ScriptReloads() int64 { return s.reloads.Load() }

// Close closes the client's connections.
func (s *Store) Close() error { return s.client.Close() }

func isNoScript(err error) bool {
	return strings.HasPrefix(err.Error(), "NOSCRIPT")
}
