package redisstore

import (
	"context"
	"slices"
	"sync"
	"time"

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
// How a charge is confirmed (on Cluster, per master: journal_cluster.go):
// a round, every JournalEvery while the
// journal holds charges, writes a barrier on one connection (a PUBLISH,
// which Redis replicates and which touches no key) and asks WAIT on the
// same connection: once a replica has acknowledged the barrier it has
// every write the master made before it, so every charge recorded
// before the round began is confirmed and forgotten. The round first
// reads the master's replication ID (master_replid, which a promoted
// replica and a restarted master take anew): when it differs from the
// last round's (a Sentinel failover, a restart), every charge kept is
// re-applied to the master there is now, each alone, as usage charges
// (recorded whatever the answer), unless its window has ended.
//
// Each charge kept carries a mark (marks.go): a bit beside its counter
// that the script sets when it records the charge, and finds set when
// the charge comes again, answering it without counting it. So a charge
// the new master already has (the replica received it before it was
// promoted, or it was charged there since) counts once.
//
// A charge the store could not take is kept too, and applied when the
// store answers again (a round that reaches a master), unless its window
// has ended: one refused before it was sent (the breaker open, the queue
// full, no connection, its deadline passed in the queue, an error reply
// such as READONLY during a failover) is applied; one sent that got no
// answer (a timeout, a connection broken mid-call, a request the network
// dropped) is sent again once a master answers, its mark counting it
// once whether the first call ran or not. A call whose caller stopped
// waiting is settled by what its round trip brings: a late answer is a
// recorded charge.
//
// What it cannot see: a charge whose marks key is gone (evicted under
// maxmemory, or its window and grace past) is counted again if sent
// again. Charges the journal cannot keep (full: JournalBytes) are
// dropped, oldest first, and counted; so are those left when the process
// stops without reaching Redis (see close).

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
	// journalReplicaGrace is how long a master that had a replica keeps
	// its charges unconfirmed once it has none: a replica reconnecting,
	// or gone because the master is failing (Redis Cluster's default
	// node timeout is 15 s), may be promoted without them.
	journalReplicaGrace = 30 * time.Second
)

// Journal outcomes, the values of
// ratelimitd_charge_journal_total{outcome}.
const (
	JournalConfirmed = "confirmed" // a replica acknowledged the charge
	JournalReapplied = "reapplied" // the master changed: applied again
	JournalKept      = "kept"      // the store could not take it, or its outcome is unknown: kept to apply
	JournalApplied   = "applied"   // a kept charge applied once the store answered
	JournalResent    = "resent"    // sent and unanswered: sent again (its mark counts it once)
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
	// slot is its counter's hash slot, on Cluster.
	slot int
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
	master                string   // master_replid of the master the last round reached
	owners                []string // on Cluster: per slot, master_replid of the master that served it at the last round
	replica               bool     // the last round found a replica (for the log)
	// replicaSeen is, per master (its master_replid), when a round last
	// found it a replica (replicaGone).
	replicaSeen map[string]time.Time
	wake        chan struct{}
	full        lograte.Limiter
	closed      bool // close has run: what comes after is abandoned
	// marks make each charge it keeps count once, however often sent.
	marks *marker
}

func newJournal(s *Store, limit int) *journal {
	if limit <= 0 {
		limit = DefaultJournalBytes
	}
	return &journal{s: s, limit: limit, replica: true, wake: make(chan struct{}, 1), marks: newMarker()}
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
	if j.s.cluster != nil {
		e.slot = slot(c.Key)
	}
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
	s.journal.keep(s.journal.marks.marked(checks, time.Now()), false)
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

// startJournal starts the charge journal when opts ask for it (auto or
// on), and says in the log whether charges are protected.
func (s *Store) startJournal(opts Options) {
	switch {
	case opts.ChargeJournal || opts.ChargeJournalAuto:
		s.journal, s.journalStop = newJournal(s, opts.JournalBytes), make(chan struct{})
		master := "the master changes first (a Sentinel failover, a restart)"
		if s.mode == ModeCluster {
			master = "its slot's master changes first (a Cluster failover, a restart, a slot moved), each master confirmed by its own replica"
		}
		s.log.Info("charge journal on: each usage charge is kept until a replica acknowledges it (with no replica, until Redis records it) and applied again if "+master+
			", one Redis could not take (down, hung, failing over) is kept and applied when it answers, one unanswered is sent again; each counts once (a mark beside its counter)",
			"mode", s.mode, "max_bytes", s.journal.limit)
		s.journalWG.Go(func() { s.journal.run(s.journalStop) })
	case opts.GrantsOnly:
	default:
		s.log.Warn("charge journal off: usage charges are not protected: one a failover loses, or that comes while Redis cannot be reached, is lost", "mode", s.mode)
	}
}
