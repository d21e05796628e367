package redisstore

// The Go side of scripts/decide.lua's contract: the embedded script, how
// requests are laid out as its keys and arguments, and how its reply is
// read. The script's header documents the same layout; TestScriptArgsGolden
// pins the encoding.

import (
	"context"
	"embed"
	"fmt"
	"slices"
	"strconv"
	"sync"

	"github.com/redis/go-redis/v9"

	"github.com/ratelimitd/ratelimitd/internal/limit"
)

//go:embed scripts/*.lua
var scriptFS embed.FS

// decideParts are the files of the decide script, in order: the call's
// arguments and rules, a budget's state, the keys' decisions.
var decideParts = []string{"decide.lua", "decide_budget.lua", "decide_keys.lua"}

// loadScripts returns the scripts, each the concatenation of its parts
// (files of scripts/) with scripts/contract.lua (the numbers shared with
// Go) and scripts/prelude.lua (now and the helpers they share) in front.
func loadScripts(scripts ...[]string) ([]*redis.Script, error) {
	var prelude []byte
	for _, f := range []string{"scripts/contract.lua", "scripts/prelude.lua"} {
		b, err := scriptFS.ReadFile(f)
		if err != nil {
			return nil, fmt.Errorf("redisstore: %w", err)
		}
		prelude = append(prelude, b...)
	}
	out := make([]*redis.Script, len(scripts))
	for i, parts := range scripts {
		src := slices.Clone(prelude)
		for _, name := range parts {
			b, err := scriptFS.ReadFile("scripts/" + name)
			if err != nil {
				return nil, fmt.Errorf("redisstore: %w", err)
			}
			src = append(src, b...)
		}
		out[i] = redis.NewScript(string(src))
	}
	return out, nil
}

// nowArg is the script's first argument: "0" (read Redis TIME) except
// in tests with a scripted clock.
func (s *Store) nowArg() string {
	if s.now != nil {
		return strconv.FormatInt(s.now().UnixMicro(), 10)
	}
	return "0"
}

// run evaluates the script once for one or more requests, reloading it
// on NOSCRIPT, and returns the flat reply: three values per key.
func (s *Store) run(ctx context.Context, reqs [][]limit.Check) ([]any, error) {
	return s.runOn(ctx, s.client, reqs)
}

// runOn is run on a given client: the store's, or one Cluster master's.
func (s *Store) runOn(ctx context.Context, c redis.Scripter, reqs [][]limit.Check) ([]any, error) {
	keys, args, err := s.scriptArgs(reqs)
	if err != nil {
		return nil, err
	}
	res, err := s.script.EvalSha(ctx, c, keys, args...).Result()
	if err != nil && isNoScript(err) {
		s.reloads.Add(1)
		s.m.ScriptReload()
		res, err = s.script.Eval(ctx, c, keys, args...).Result()
	}
	return checkReply(res, err, counterKeys(reqs))
}

// counterKeys is the number of counter keys of requests: the script
// answers three values for each (and none for their pair keys).
func counterKeys(reqs [][]limit.Check) int {
	n := 0
	for _, r := range reqs {
		n += len(r)
	}
	return n
}

// scriptArgs lays requests out as the script's keys and arguments: the
// requests' distinct rules go once each, and every key refers to its rule
// in one number with its hits and flags (see scripts/decide.lua), which
// leaves room for 2^13 rules per call; the dispatcher keeps a batch far
// below that (maxBatchKeys), and a single request beyond it is refused.
// The pair keys of checks that carry a request id follow the counter
// keys, in the checks' order, and the marks keys of charges that carry
// a mark follow them (their bits' offsets come before the keys' values).
func (s *Store) scriptArgs(reqs [][]limit.Check) ([]string, []any, error) {
	// ones: one key a request, the common batch: the script is told so
	// by a negative count of requests, and reads no count per request.
	nkeys, ones := 0, true
	for _, r := range reqs {
		nkeys += len(r)
		ones = ones && len(r) == 1
	}
	keys := make([]string, 0, nkeys)
	var rules []rule
	// A call usually holds a few rules, found faster by a scan than in a
	// map; request overrides can make every key's rule distinct, and the
	// scan would then be quadratic in the batch.
	var index map[rule]int
	perKey := make([]any, 0, nkeys)
	var big []any
	var pairs, marks []string
	var offs []any
	for _, r := range reqs {
		for _, c := range r {
			keys = append(keys, c.Key)
			ru := rule{c.Limit, c.WindowUS, c.Algorithm, c.Burst, c.FlightS, c.Calendar}
			q := -1
			if index == nil {
				q = slices.Index(rules, ru)
			} else if i, ok := index[ru]; ok {
				q = i
			}
			if q < 0 {
				q = len(rules)
				rules = append(rules, ru)
				if index != nil {
					index[ru] = q
				} else if len(rules) > scanRules {
					index = make(map[rule]int, nkeys)
					for i, r := range rules {
						index[r] = i
					}
				}
			}
			if q >= maxRules {
				return nil, nil, fmt.Errorf("redisstore: more than %d distinct limits in one script call", maxRules)
			}
			flags := checkFlags(&c)
			if c.PairID != "" {
				flags |= flagPair
				pairs = append(pairs, pairKey(c.Key, c.PairID))
			}
			if c.MarkKey != "" {
				flags |= flagMark
				marks, offs = append(marks, c.MarkKey), append(offs, c.MarkOff)
			}
			hits := c.SaturatedHits()
			if hits >= bigHits {
				// Packed, the hits would leave a double's exact range:
				// they go after the keys' values, and the key holds
				// their place.
				big = append(big, hits)
				hits, flags = uint64(len(big)), flags|flagBig
			}
			perKey = append(perKey, hits<<hitsShift|uint64((q+1)*ruleUnit+flags))
		}
	}
	args := make([]any, 0, 5+len(reqs)+4*len(rules)+len(offs)+len(perKey))
	if ones {
		args = append(args, s.nowArg(), -len(reqs))
	} else {
		args = append(args, s.nowArg(), len(reqs))
		for _, r := range reqs {
			args = append(args, len(r))
		}
	}
	args = append(args, len(rules))
	for _, ru := range rules {
		args = append(args, ru.limit, ru.windowUS, int64(ru.algorithm)+calendarUnit*int64(ru.calendar)+flightUnit*ru.flightS, ru.burst)
	}
	args = append(args, len(pairs), len(marks))
	args = append(args, offs...)
	return append(append(keys, pairs...), marks...), append(append(args, perKey...), big...), nil
}

// checkFlags are c's refund, shadow and usage flags, its usage kind
// packed above them.
func checkFlags(c *limit.Check) int {
	flags := 0
	if c.Refund {
		flags |= flagRefund
	}
	if c.NoVeto {
		flags |= flagNoVeto
	}
	if c.Usage {
		flags |= flagUsage + int(c.Kind)*kindUnit
	}
	return flags
}

// bigHits are hits too large to pack with a key's rule and flags.
const bigHits = 1 << 32

// The script's contract (contract.go renders each into
// scripts/contract.lua, which every script is sent with). A key's argument is
// hits<<hitsShift + rule*ruleUnit + flags, the usage kind in the flags as
// kind*kindUnit; a rule's third argument is algorithm +
// calendar*calendarUnit + FlightS*flightUnit.
const (
	hitsShift    = 21  // HITS_UNIT = 2^21
	ruleUnit     = 256 // RULE_UNIT
	kindUnit     = 16  // KIND_UNIT
	flagRefund   = 1   // FLAG_REFUND
	flagNoVeto   = 2   // FLAG_NO_VETO: shadow
	flagUsage    = 4   // FLAG_USAGE: a rule that takes usage after the fact
	flagBig      = 8   // FLAG_BIG: the hits follow the keys' values
	flagPair     = 64  // FLAG_PAIR: the check carries a request id; its pair key follows the counter keys
	flagMark     = 128 // FLAG_MARK: the charge carries a mark; its marks key follows the pair keys
	calendarUnit = 4   // CALENDAR_UNIT
	flightUnit   = 16  // FLIGHT_UNIT
)

// maxRules bounds the distinct rules of one script call (see scriptArgs);
// beyond scanRules, scriptArgs finds them through a map.
const (
	maxRules  = 1<<13 - 1
	scanRules = 8
)

// checkReply returns the script's flat reply for nkeys keys.
func checkReply(res any, err error, nkeys int) ([]any, error) {
	return checkReplyOf(res, err, 3*nkeys)
}

// checkReplyOf checks that a reply is a list of nvals values.
func checkReplyOf(res any, err error, nvals int) ([]any, error) {
	if err != nil {
		return nil, err
	}
	vals, ok := res.([]any)
	if !ok || len(vals) != nvals {
		return nil, fmt.Errorf("unexpected reply %v", res)
	}
	return vals, nil
}

// rule is what the script needs to know of a check besides its key, hits
// and flags; checks of one rule share it within a call.
type rule struct {
	limit     uint64
	windowUS  int64
	algorithm limit.Algorithm
	burst     uint64
	flightS   int64 // the longest a budget check is in flight (limit.Check.FlightS)
	calendar  limit.Calendar
}

// scriptError is a Redis error reply that ended one request inside a
// script call (WRONGTYPE, OOM, NOREPLICAS, ...).
type scriptError string

func (e scriptError) Error() string { return string(e) }

// RedisError marks it as a Redis error reply, for Classify.
func (scriptError) RedisError() {}

// splitReply returns the n keys' values starting at key k0, or the error
// the script reported for that request.
func splitReply(vals []any, k0, n int) ([]any, error) {
	part := vals[3*k0 : 3*(k0+n)]
	if n > 0 {
		if flag, _ := part[0].(int64); flag == -1 {
			msg, _ := part[1].(string)
			return nil, scriptError(msg)
		}
	}
	return part, nil
}

// isNoScript reports that Redis had lost the script (a restart, SCRIPT
// FLUSH, a failover).
func isNoScript(err error) bool { return redis.HasErrorPrefix(err, "NOSCRIPT") }

// pairKey is the key that keeps when the request named id was admitted
// on the counter key: in the counter's hash slot (a hash tag of that slot
// leads it, whatever braces the counter key holds), so one script call
// takes both on Redis Cluster.
func pairKey(key, id string) string {
	return "{" + slotTag(slot(key)) + "}" + key + "|pair|" + id
}

// slotTags holds, for each hash slot, a short tag that hashes to it.
var slotTags = sync.OnceValue(func() []string {
	tags := make([]string, 16384)
	left := len(tags)
	for n := 0; left > 0; n++ {
		t := strconv.Itoa(n)
		if sl := slot(t); tags[sl] == "" {
			tags[sl] = t
			left--
		}
	}
	return tags
})

func slotTag(sl int) string { return slotTags()[sl] }
