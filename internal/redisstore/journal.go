package redisstore

import (
	"cmp"
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
// A charge the store could not take is kept too, and applied when the
// store answers again (a round that reaches a master), unless its window
// has ended: one refused before it was sent (the breaker open, the queue
// full, no connection, its deadline passed in the queue, an error reply
// such as READONLY during a failover) is applied; one sent that got no
// answer (a timeout, a connection broken mid-call) is applied if the
// master has changed since, and otherwise taken as recorded, as the
// master that received it runs it when it resumes (a stall), and is
// confirmed as any other. A call whose caller stopped waiting is
// settled by what its round trip brings: a late answer is a recorded
// charge.
//
// What it errs on: a charge recorded on the new master before the first
// round that sees the change is re-applied too, and so counted twice:
// at most the charges of one round (JournalEvery) after the failover;
// so is a charge whose call a dying master ran without answering. A
// spend cap counted twice errs on the safe side; a lost charge does not.
// What it cannot see: a charge sent to a master that stays master but
// never received it (a network partition that drops the request, not a
// stall) is taken as recorded. Charges the journal cannot keep (full:
// JournalBytes) are dropped, oldest first, and counted; so are those
// left when the process stops without reaching Redis (see close).

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
	JournalKept      = "kept"      // the store could not take it, or its outcome is unknown: kept to apply
	JournalApplied   = "applied"   // a kept charge applied once the store answered
	JournalAssumed   = "assumed"   // sent, unanswered, and the master the same: taken as recorded
	JournalExpired   = "expired"   // the master changed after the charge's window ended
	JournalFailed    = "failed"    // re-applying it failed (Redis down): kept for the next round
	JournalRefused   = "refused"   // Redis refused it applied again with an error of the script's: dropped
	JournalDropped   = "dropped"   // the journal was full: forgotten unconfirmed
	JournalNoReplica = "no_replica"
	JournalAbandoned = "abandoned" // the store closed with it unconfirmed
)

type journalEntry struct {
	seq   uint64
	check limit.Check
	// end is when the charge's window ends, by this process's monotonic
	// clock (the script's reset, counted from the answer; for a charge
	// not recorded, from the window by this process's clock).
	end  time.Time
	size int
	// kept: the store did not take it when it came (applied, not
	// re-applied).
	kept bool
	// master is, for a charge sent and not answered, the master the
	// journal knew then ("": none yet).
	master string
}

type journal struct {
	s     *Store
	limit int // bytes

	mu sync.Mutex
	// entries are charges Redis recorded, oldest first; redo those to
	// apply again, on the master there is now; unsure those sent and not
	// answered.
	entries, redo, unsure []journalEntry
	bytes                 int
	seq                   uint64
	master                string // master_replid of the master the last round reached
	replica               bool   // the last round found a replica (for the log)
	wake                  chan struct{}
	full                  lograte.Limiter
	closed                bool // close has run: what comes after is abandoned
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
	if !hasJournaled(checks) {
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
		j.entries = append(j.entries, j.entryLocked(*c, now.Add(time.Duration(res[i].ResetUS)*time.Microsecond)))
		added = true
	}
	j.settled(now, added)
}

// entryLocked makes an entry of c with the next seq, its size counted.
func (j *journal) entryLocked(c limit.Check, end time.Time) journalEntry {
	j.seq++
	e := journalEntry{seq: j.seq, check: c, end: end, size: journalEntryBytes + len(c.Key) + len(c.Incumbent)}
	j.bytes += e.size
	return e
}

// settled drops the oldest entries past the journal's bound, under j.mu,
// which it releases, and wakes a round when entries were added.
func (j *journal) settled(now time.Time, added bool) {
	if j.closed {
		late := append(j.entries, append(j.redo, j.unsure...)...)
		j.entries, j.redo, j.unsure, j.bytes = nil, nil, nil, 0
		j.mu.Unlock()
		j.abandon(late, "charge journal: a usage charge settled after the store closed: not kept")
		return
	}
	dropped := 0
	for j.bytes > j.limit {
		var q *[]journalEntry
		for _, l := range []*[]journalEntry{&j.redo, &j.unsure, &j.entries} {
			if len(*l) > 0 && (q == nil || (*l)[0].seq < (*q)[0].seq) {
				q = l
			}
		}
		if q == nil {
			break
		}
		j.bytes -= (*q)[0].size
		*q = (*q)[1:]
		dropped++
	}
	n := j.lenLocked()
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
// (a zero charge changes no count), a budget's or a plain one.
func journaled(c limit.Check) bool {
	return c.Charge() && (c.Kind == limit.ByHits || c.Kind == limit.PlainCharge)
}

// keep takes the usage charges among checks, which the store did not
// record, to apply when it answers again; unanswered: they were sent
// and no answer came, so they may have been recorded.
func (j *journal) keep(checks []limit.Check, unanswered bool) {
	now := time.Now()
	j.mu.Lock()
	n := 0
	for i := range checks {
		c := checks[i]
		if !journaled(c) {
			continue
		}
		_, end := c.Window(now.UnixMicro())
		e := j.entryLocked(c, time.UnixMicro(end))
		e.kept = true
		if unanswered {
			e.master = j.master
			j.unsure = append(j.unsure, e)
		} else {
			j.redo = append(j.redo, e)
		}
		n++
	}
	j.settled(now, n > 0)
	j.s.m.ChargeJournal(JournalKept, n)
}

// KeepCharges keeps the usage charges among checks, which the caller
// had no time to send, to apply when the store answers (see
// service.ChargeKeeper); false without a journal or a charge.
func (s *Store) KeepCharges(checks []limit.Check) bool {
	if s.journal == nil || !hasJournaled(checks) {
		return false
	}
	s.journal.keep(checks, false)
	return true
}

// hasJournaled reports whether checks hold a charge the journal keeps.
func hasJournaled(checks []limit.Check) bool { return slices.ContainsFunc(checks, journaled) }

// settle takes what became of a call carrying usage charges: recorded
// with res, or err.
func (j *journal) settle(checks []limit.Check, res []limit.Result, err error) {
	switch {
	case err == nil:
		j.note(checks, res)
	case readTimedOut(err):
		j.keep(checks, true)
	default:
		// Not sent, refused with an error reply, or a failure that does
		// not say the call was written (a connection's setup timing out,
		// a connection broken): applied, erring towards counting twice.
		j.keep(checks, false)
	}
}

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
	return j.lenLocked()
}

func (j *journal) lenLocked() int { return len(j.entries) + len(j.redo) + len(j.unsure) }

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
		j.redo = bySeq(append(j.redo, j.entries[:k]...))
		j.entries = j.entries[k:]
	}
	assumed := j.resolveUnsureLocked(id)
	redo := len(j.redo)
	j.mu.Unlock()
	j.s.m.ChargeJournal(JournalAssumed, assumed)
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

// resolveUnsureLocked settles the charges sent and not answered, now
// that the master id answers: those sent to another master (or before
// any was known) are applied; those sent to this one are taken as
// recorded, kept as its entries until a replica confirms them. It
// returns how many it took as recorded.
func (j *journal) resolveUnsureLocked(id string) int {
	if len(j.unsure) == 0 {
		return 0
	}
	assumed := 0
	for _, e := range j.unsure {
		if e.master == "" || e.master != id {
			j.redo = append(j.redo, e)
			continue
		}
		e.kept = false
		j.entries = append(j.entries, e)
		assumed++
	}
	j.unsure = nil
	j.entries, j.redo = bySeq(j.entries), bySeq(j.redo)
	return assumed
}

// bySeq puts entries merged from several lists back in seq order: a
// round confirms entries up to a seq, and a full journal drops the
// oldest first.
func bySeq(l []journalEntry) []journalEntry {
	slices.SortFunc(l, func(a, b journalEntry) int { return cmp.Compare(a.seq, b.seq) })
	return l
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
	n := j.lenLocked()
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

// reapply applies each entry of redo again, in chunks of one script
// call, unless its window has ended; one that fails stays for the next
// round, one whose call went unanswered is settled as any such call.
func (j *journal) reapply(ctx context.Context) {
	j.mu.Lock()
	redo := j.redo
	j.redo = nil
	j.mu.Unlock()
	outcome := make([]string, len(redo))
	var live []int
	for i := range redo {
		if !time.Now().Before(redo[i].end) {
			outcome[i] = JournalExpired
			continue
		}
		live = append(live, i)
	}
	// A few chunks at once, each one script call deciding its charges
	// in turn: an outage of seconds leaves thousands.
	sem := make(chan struct{}, reapplyConcurrency)
	var wg sync.WaitGroup
	for len(live) > 0 {
		chunk := live[:min(len(live), reapplyChunk)]
		live = live[len(chunk):]
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			j.apply(ctx, redo, chunk, outcome)
		})
	}
	wg.Wait()
	counts := map[string]int{}
	var keep, unsure []journalEntry
	freed := 0
	for i, e := range redo {
		switch outcome[i] {
		case JournalFailed:
			keep = append(keep, e)
		case unansweredApply:
			// It may have run: settled as any call sent and unanswered,
			// counted a failed application.
			unsure = append(unsure, e)
			outcome[i] = JournalFailed
		default:
			freed += e.size
		}
		counts[outcome[i]]++
	}
	if counts[JournalRefused] > 0 {
		j.s.log.Error("charge journal: Redis refused usage charges applied again; they are dropped", "charges", counts[JournalRefused])
	}
	j.mu.Lock()
	j.redo = bySeq(append(keep, j.redo...))
	for _, e := range unsure {
		e.master = j.master
		j.unsure = append(j.unsure, e)
	}
	j.bytes -= freed
	j.mu.Unlock()
	for outcome, n := range counts {
		j.s.m.ChargeJournal(outcome, n)
	}
	j.s.m.SetChargeJournal(j.len())
}

// reapplyConcurrency bounds the script calls a round applies charges
// with at once, and reapplyChunk the charges of one.
const (
	reapplyConcurrency = 4
	reapplyChunk       = 64
)

// apply applies the charges redo[chunk] again in one script call, each
// its own request, and sets their outcomes; applied, each is noted
// anew, as the master's there is now.
func (j *journal) apply(ctx context.Context, redo []journalEntry, chunk []int, outcome []string) {
	reqs := make([][]limit.Check, len(chunk))
	for k, i := range chunk {
		reqs[k] = []limit.Check{redo[i].check}
	}
	// Its own script call, outside the dispatchers: its outcome is the
	// call's, never a deadline's answer while the call still runs.
	ctx, cancel := context.WithTimeout(ctx, j.s.timeout)
	defer cancel()
	vals, err := j.s.run(ctx, reqs)
	var applied []limit.Check
	var res []limit.Result
	for k, i := range chunk {
		e := &redo[i]
		var part []any
		perr := err
		if err == nil {
			part, perr = splitReply(vals, k, 1)
		}
		switch {
		case perr == nil:
			applied, res = append(applied, e.check), append(res, results(part, 1)...)
			outcome[i] = JournalReapplied
			if e.kept {
				outcome[i] = JournalApplied
			}
		case readTimedOut(perr):
			outcome[i] = unansweredApply
		case err == nil:
			// An error of the script's own for this charge, which asking
			// again would only repeat.
			outcome[i] = JournalRefused
		default:
			outcome[i] = JournalFailed
		}
	}
	j.note(applied, res)
}

// unansweredApply is apply's outcome for a charge sent and unanswered.
const unansweredApply = "unanswered"

// close hands the journal to Redis before the process stops: it runs
// rounds until the charges kept to apply are applied, or JournalHandoff
// has passed with Redis not answering, with at least one round so that
// what a replica has by now is not reported lost; then it counts what is
// left as abandoned. Charges settled after it are abandoned too.
func (j *journal) close() {
	deadline := time.Now().Add(JournalHandoff)
	for first := true; ; first = false {
		j.mu.Lock()
		toApply, n := len(j.redo)+len(j.unsure), j.lenLocked()
		j.mu.Unlock()
		if n == 0 || !first && (toApply == 0 || !time.Now().Before(deadline)) {
			break
		}
		if !first {
			time.Sleep(JournalEvery)
		}
		j.round(context.Background())
	}
	j.mu.Lock()
	j.closed = true
	recorded, unapplied := j.entries, append(j.redo, j.unsure...)
	j.entries, j.redo, j.unsure, j.bytes = nil, nil, nil, 0
	j.mu.Unlock()
	j.abandon(recorded, "charge journal: stopping with usage charges no replica acknowledged: a failover now would lose them")
	j.abandon(unapplied, "charge journal: stopping with usage charges Redis has not recorded (it did not answer): they are lost")
}

// JournalHandoff bounds how long a stopping store keeps trying to apply
// the charges it kept while Redis did not answer.
const JournalHandoff = 5 * time.Second

// abandon counts entries as abandoned, and logs msg with them.
func (j *journal) abandon(entries []journalEntry, msg string) {
	if len(entries) == 0 {
		return
	}
	var hits uint64
	for _, e := range entries {
		hits += e.check.Hits
	}
	j.s.m.ChargeJournal(JournalAbandoned, len(entries))
	j.s.log.Error(msg, "charges", len(entries), "hits", hits)
}
