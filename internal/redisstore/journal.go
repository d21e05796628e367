package redisstore

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratelimitd/ratelimitd/internal/limit"
	"github.com/ratelimitd/ratelimitd/internal/lograte"
)

// The charge journal (Options.ChargeJournal, --charge-journal) keeps each
// usage charge Redis recorded until a replica has acknowledged it, and
// re-applies the ones not acknowledged when the master changes. Redis
// replicates asynchronously: a master that dies takes with it the writes
// its replica had not received, and for a spend cap those are money.
// The stream-end call that carries a charge is the one nobody waits for,
// so the confirmation runs beside the requests, never in their way.
//
// How a charge is confirmed: a round, every JournalEvery while the
// journal holds charges, writes a barrier on one connection (a PUBLISH,
// which Redis replicates and which touches no key) and asks WAIT on the
// same connection: once a replica has acknowledged the barrier it has
// every write the master made before it, so every charge recorded
// before the round began is confirmed and forgotten. The round first
// reads the master's replication ID (master_replid, which a promoted
// replica and a restarted master take anew): when it differs from the
// last round's (a Sentinel failover, a restart), the charges noted
// before the round began are re-applied to the master there is now,
// each alone, as usage charges (recorded whatever the answer), unless
// their window has ended.
//
// What it errs on: a charge recorded on the new master before the first
// round that sees the change is re-applied too, and so counted twice:
// at most the charges of one round (JournalEvery) after the failover. A
// spend cap counted twice errs on the safe side; a lost charge does not.
// Charges the journal cannot keep (full: JournalBytes) are dropped,
// oldest first, and counted; so are those left when the process stops.

// Defaults of the journal's options.
const (
	DefaultJournalBytes = 16 << 20
	// JournalEvery is how often a round confirms the journal's charges.
	JournalEvery = 50 * time.Millisecond
	// journalIdleEvery is how often a round reads the master's identity
	// while the journal is empty: a change it sees then re-applies
	// nothing, but the next charges are known to be the new master's.
	journalIdleEvery = time.Second
	// journalWait bounds the WAIT of a round: a replica that lags longer
	// leaves the charges for the next round.
	journalWait = 200 * time.Millisecond
	// journalEntryBytes is what an entry costs beside its key.
	journalEntryBytes = 160
	// barrierChannel is the channel of the round's barrier; nobody
	// listens to it.
	barrierChannel = "ratelimitd:charge-journal"
	// journalReplicas is how many replicas must acknowledge a barrier.
	journalReplicas = 1
)

// Journal outcomes, the values of
// ratelimitd_charge_journal_total{outcome}.
const (
	JournalConfirmed = "confirmed" // a replica acknowledged the charge
	JournalReapplied = "reapplied" // the master changed: applied again
	JournalExpired   = "expired"   // the master changed after the charge's window ended
	JournalFailed    = "failed"    // re-applying it failed (Redis down): kept for the next round
	JournalDropped   = "dropped"   // the journal was full: forgotten unconfirmed
	JournalNoReplica = "no_replica"
	JournalAbandoned = "abandoned" // the store closed with it unconfirmed
)

type journalEntry struct {
	seq   uint64
	check limit.Check
	// end is when the charge's window ends, by this process's monotonic
	// clock (the script's reset, counted from the answer).
	end  time.Time
	size int
}

type journal struct {
	s     *Store
	limit int // bytes

	mu sync.Mutex
	// entries are charges Redis recorded, oldest first; redo those to
	// apply again, on the master there is now.
	entries, redo []journalEntry
	bytes         int
	seq           uint64
	master        string // master_replid of the master the last round reached
	replica       bool   // the last round found a replica (for the log)
	wake          chan struct{}
	full          lograte.Limiter
}

func newJournal(s *Store, limit int) *journal {
	if limit <= 0 {
		limit = DefaultJournalBytes
	}
	return &journal{s: s, limit: limit, replica: true, wake: make(chan struct{}, 1)}
}

// note keeps the usage charges among checks, which Redis recorded with
// results res.
func (j *journal) note(checks []limit.Check, res []limit.Result) {
	if !slices.ContainsFunc(checks, journaled) {
		return
	}
	now := time.Now()
	j.mu.Lock()
	added := false
	for i := range checks {
		c := &checks[i]
		if !journaled(*c) {
			continue
		}
		j.seq++
		e := journalEntry{seq: j.seq, check: *c, end: now.Add(time.Duration(res[i].ResetUS) * time.Microsecond),
			size: journalEntryBytes + len(c.Key) + len(c.Incumbent)}
		j.entries = append(j.entries, e)
		j.bytes += e.size
		added = true
	}
	dropped := 0
	for j.bytes > j.limit && len(j.entries) > 0 {
		j.bytes -= j.entries[0].size
		j.entries = j.entries[1:]
		dropped++
	}
	n := len(j.entries) + len(j.redo)
	j.mu.Unlock()
	if dropped > 0 {
		j.s.m.ChargeJournal(JournalDropped, dropped)
		if j.full.Allow(now, time.Minute) {
			j.s.log.Error("charge journal full: unconfirmed charges forgotten, oldest first (a replica that does not acknowledge, or --charge-journal-size too small)",
				"dropped", dropped, "limit_bytes", j.limit)
		}
	}
	j.s.m.SetChargeJournal(n)
	if added {
		select {
		case j.wake <- struct{}{}:
		default:
		}
	}
}

// journaled reports a check the journal keeps: a usage charge of hits
// (a zero charge changes no count).
func journaled(c limit.Check) bool { return c.Charge() && c.Kind == limit.ByHits }

// run confirms the journal's charges until stop closes.
func (j *journal) run(stop <-chan struct{}) {
	t := time.NewTimer(0)
	defer t.Stop()
	idle := false // the timer is the idle one (journalIdleEvery)
	for {
		select {
		case <-stop:
			return
		case <-t.C:
		case <-j.wake:
			// A charge after a quiet spell is confirmed at once; while
			// charges flow, a round every JournalEvery takes them all.
			if !idle || !t.Stop() {
				continue
			}
		}
		j.round(context.Background())
		every := journalIdleEvery
		if idle = j.len() == 0; !idle {
			every = JournalEvery
		}
		t.Reset(every)
	}
}

func (j *journal) len() int {
	j.mu.Lock()
	defer j.mu.Unlock()
	return len(j.entries) + len(j.redo)
}

// round confirms what a replica has, and re-applies what the master
// lost when it changed. It reads the master's identity first, on the
// connection it then writes its barrier on: a change is seen before a
// barrier is waited for, and the charges noted since the round began
// (upTo) are left to the next round, as the new master's.
func (j *journal) round(ctx context.Context) {
	j.mu.Lock()
	upTo, pending := j.seq, len(j.entries)
	j.mu.Unlock()
	j.roundUpTo(ctx, upTo, pending)
}

// roundUpTo is the round begun when the journal's last charge was upTo
// and it held pending charges.
func (j *journal) roundUpTo(ctx context.Context, upTo uint64, pending int) {
	ctx, cancel := context.WithTimeout(ctx, journalWait+j.s.timeout)
	defer cancel()
	conn := j.s.client.(interface {
		Conn() *redis.Conn
	}).Conn()
	defer conn.Close()
	id, replicas, err := masterInfo(ctx, conn)
	if err != nil {
		// Redis is down or failing over: the charges stay.
		return
	}
	j.mu.Lock()
	changed := j.master != "" && id != j.master
	j.master = id
	if changed {
		k := 0
		for k < len(j.entries) && j.entries[k].seq <= upTo {
			k++
		}
		j.redo = append(j.redo, j.entries[:k]...)
		j.entries = j.entries[k:]
	}
	redo := len(j.redo)
	j.mu.Unlock()
	if changed {
		j.s.log.Warn("redis master changed: re-applying the usage charges no replica had acknowledged", "replid", id, "charges", redo)
	}
	if redo > 0 {
		// Applied again, each is noted anew (a seq past upTo): a later
		// round confirms it on this master.
		j.reapply(ctx)
	}
	if changed {
		return
	}
	j.noteReplicas(replicas)
	switch {
	case pending == 0:
	case replicas == 0:
		// Nothing can confirm them: keeping them would fill the journal
		// and re-apply them after a restart that kept them (persistence).
		j.confirm(upTo, JournalNoReplica)
	default:
		if acked, err := barrier(ctx, conn); err == nil && acked >= journalReplicas {
			j.confirm(upTo, JournalConfirmed)
		}
	}
}

// masterInfo reads the replication ID and the connected replicas of the
// master conn reaches (one INFO section: Redis 6 takes no more).
func masterInfo(ctx context.Context, conn *redis.Conn) (id string, replicas int, err error) {
	text, err := conn.Info(ctx, "replication").Result()
	if err != nil {
		return "", 0, fmt.Errorf("charge journal round: %w", err)
	}
	if role := infoField(text, "role"); role != "master" {
		return "", 0, fmt.Errorf("charge journal round: reached a %s", role)
	}
	_, _ = fmt.Sscan(infoField(text, "connected_slaves"), &replicas)
	return infoField(text, "master_replid"), replicas, nil
}

// barrier writes a barrier on conn and waits for journalReplicas
// replicas to acknowledge it: once one has, it has every write the
// master made before.
func barrier(ctx context.Context, conn *redis.Conn) (acked int, err error) {
	var ack *redis.Cmd
	_, err = conn.Pipelined(ctx, func(p redis.Pipeliner) error {
		p.Publish(ctx, barrierChannel, "")
		ack = p.Do(ctx, "WAIT", journalReplicas, journalWait.Milliseconds())
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("charge journal barrier: %w", err)
	}
	n, err := ack.Int64()
	return int(n), err
}

// infoField returns field's value in an INFO reply.
func infoField(info, field string) string {
	for line := range strings.Lines(info) {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

// confirm forgets the entries up to seq, counting them as outcome.
func (j *journal) confirm(seq uint64, outcome string) {
	j.mu.Lock()
	k := 0
	for k < len(j.entries) && j.entries[k].seq <= seq {
		j.bytes -= j.entries[k].size
		k++
	}
	j.entries = j.entries[k:]
	n := len(j.entries) + len(j.redo)
	j.mu.Unlock()
	j.s.m.ChargeJournal(outcome, k)
	j.s.m.SetChargeJournal(n)
}

func (j *journal) noteReplicas(replicas int) {
	j.mu.Lock()
	had := j.replica
	j.replica = replicas > 0
	j.mu.Unlock()
	switch {
	case had && replicas == 0:
		j.s.log.Warn("charge journal: the Redis master has no replica: usage charges cannot be confirmed and are not kept; a failover or a restart without persistence loses the window's charges")
	case !had && replicas > 0:
		j.s.log.Info("charge journal: the Redis master has a replica again: usage charges are kept until it acknowledges them", "replicas", replicas)
	}
}

// reapply applies each entry of redo again, alone, unless its window
// has ended; one that fails stays for the next round.
func (j *journal) reapply(ctx context.Context) {
	j.mu.Lock()
	redo := j.redo
	j.redo = nil
	j.mu.Unlock()
	counts := map[string]int{}
	var keep []journalEntry
	freed := 0
	for _, e := range redo {
		switch {
		case !time.Now().Before(e.end):
			counts[JournalExpired]++
		case j.reapplied(ctx, e):
			// evaluateExact noted it again, as the new master's.
			counts[JournalReapplied]++
		default:
			counts[JournalFailed]++
			keep = append(keep, e)
			continue
		}
		freed += e.size
	}
	j.mu.Lock()
	j.redo = append(keep, j.redo...)
	j.bytes -= freed
	j.mu.Unlock()
	for outcome, n := range counts {
		j.s.m.ChargeJournal(outcome, n)
	}
	j.s.m.SetChargeJournal(j.len())
}

// reapplied reports whether e's charge was applied again.
func (j *journal) reapplied(ctx context.Context, e journalEntry) bool {
	_, err := j.s.evaluateExact(ctx, []limit.Check{e.check})
	return err == nil
}

// close runs a last round, so that what a replica has by now is not
// reported lost, and counts what is left.
func (j *journal) close() {
	if j.len() > 0 {
		j.round(context.Background())
	}
	j.mu.Lock()
	left := append(j.redo, j.entries...)
	n := len(left)
	var hits uint64
	for _, e := range left {
		hits += e.check.Hits
	}
	j.entries, j.redo, j.bytes = nil, nil, 0
	j.mu.Unlock()
	if n > 0 {
		j.s.m.ChargeJournal(JournalAbandoned, n)
		j.s.log.Error("charge journal: stopping with usage charges no replica acknowledged: a failover now would lose them",
			"charges", n, "hits", hits)
	}
}
