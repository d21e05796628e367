package redisstore

// The charge journal's round (see journal.go): the barrier and WAIT that
// confirm charges, the master's replication ID that says it changed, and
// the charges applied again, or kept, and abandoned at close.

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
)

// round confirms what a replica has, and re-applies what the master
// lost when it changed. It reads the master's identity first, on the
// connection it then writes its barrier on: a change is seen before a
// barrier is waited for. Every charge is marked (marker): re-applied,
// one the new master already has counts once.
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
	if j.s.cluster != nil {
		j.clusterRoundUpTo(ctx, upTo, pending)
		return
	}
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
		j.redo = bySeq(append(j.redo, j.entries...))
		j.entries = nil
	}
	resent := j.resolveUnsureLocked()
	redo := len(j.redo)
	j.mu.Unlock()
	j.s.m.ChargeJournal(JournalResent, resent)
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
		if j.replicaGone(id, replicas) {
			// Nothing can confirm them: keeping them would fill the
			// journal and re-apply them after a restart that kept them
			// (persistence).
			j.confirm(upTo, JournalNoReplica)
		}
	default:
		j.replicaGone(id, replicas)
		if acked, err := barrierOn(ctx, conn, ""); err == nil && acked >= journalReplicas {
			j.confirm(upTo, JournalConfirmed)
		}
	}
}

// resolveUnsureLocked sends again the charges sent and not answered, now
// that a master answers: a request the network dropped never reached
// it, and one it ran is skipped by its mark. It returns how many.
func (j *journal) resolveUnsureLocked() int {
	n := len(j.unsure)
	j.redo = bySeq(append(j.redo, j.unsure...))
	j.unsure = nil
	return n
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

// barrierOn writes a barrier on conn and waits for journalReplicas
// replicas to acknowledge it: once one has, it has every write the
// master made before. The barrier is a PUBLISH, which touches no key;
// on Cluster, where a PUBLISH is not replicated, a key of the node's own
// slots written (key), kept a second.
func barrierOn(ctx context.Context, conn *redis.Conn, key string) (acked int, err error) {
	var ack *redis.Cmd
	_, err = conn.Pipelined(ctx, func(p redis.Pipeliner) error {
		if key != "" {
			p.Set(ctx, key, "", time.Second)
		} else {
			p.Publish(ctx, barrierChannel, "")
		}
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
	j.confirmWhere(seq, outcome, nil)
}

// confirmWhere forgets the entries up to seq whose counter's slot in is
// true of (nil: all), counting them as outcome.
func (j *journal) confirmWhere(seq uint64, outcome string, in func(slot int) bool) {
	j.mu.Lock()
	k := 0
	kept := j.entries[:0]
	for _, e := range j.entries {
		if e.seq <= seq && (in == nil || in(e.slot)) {
			j.bytes -= e.size
			k++
		} else {
			kept = append(kept, e)
		}
	}
	clear(j.entries[len(kept):])
	j.entries = kept
	n := j.lenLocked()
	j.mu.Unlock()
	j.s.m.ChargeJournal(outcome, k)
	j.s.m.SetChargeJournal(n)
}

// replicaGone notes that master id has replicas, and reports that it
// has had none for journalReplicaGrace, or never had one: its charges
// are then not kept (nothing could confirm them).
func (j *journal) replicaGone(id string, replicas int) bool {
	j.mu.Lock()
	defer j.mu.Unlock()
	now := time.Now()
	if replicas > 0 {
		if j.replicaSeen == nil {
			j.replicaSeen = map[string]time.Time{}
		}
		j.replicaSeen[id] = now
		return false
	}
	seen, ok := j.replicaSeen[id]
	return !ok || now.Sub(seen) >= journalReplicaGrace
}

func (j *journal) noteReplicas(replicas int) {
	j.mu.Lock()
	had := j.replica
	j.replica = replicas > 0
	j.mu.Unlock()
	switch {
	case had && replicas == 0:
		j.s.log.Warn("charge journal: the Redis master has no replica: the charges it records cannot be confirmed and are not kept once recorded (a restart without persistence loses the window's charges); those it does not take or answer are still kept, and applied once when it answers")
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
	for _, chunk := range j.chunks(redo, live) {
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
	j.unsure = append(j.unsure, unsure...)
	j.bytes -= freed
	j.mu.Unlock()
	for outcome, n := range counts {
		j.s.m.ChargeJournal(outcome, n)
	}
	j.s.m.SetChargeJournal(j.len())
}

// chunks splits the indexes live of redo into the script calls that
// apply them: at most reapplyChunk each, and on Cluster one slot's.
func (j *journal) chunks(redo []journalEntry, live []int) [][]int {
	groups := [][]int{live}
	if j.s.cluster != nil {
		groups = groups[:0]
		for _, g := range groupBySlot(len(live), func(k int) string { return redo[live[k]].check.Key }) {
			idx := make([]int, len(g.idx))
			for k, i := range g.idx {
				idx[k] = live[i]
			}
			groups = append(groups, idx)
		}
	}
	var out [][]int
	for _, g := range groups {
		for len(g) > 0 {
			n := min(len(g), reapplyChunk)
			out = append(out, g[:n])
			g = g[n:]
		}
	}
	return out
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
