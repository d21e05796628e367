package redisstore

// The charge journal on Redis Cluster (see journal.go). Each master
// replicates apart: a round asks every master on a connection of its
// own for its replication ID and the slots it serves, writes a barrier
// in one of its slots and waits for its replica, and so confirms the
// charges of that master's slots. A slot whose master's replication ID
// differs from the last round's (its replica promoted after a failover,
// the master restarted, the slot moved to another master) has its
// unconfirmed charges re-applied on the master there is now: their
// marks, kept in the counters' slots, make each count once.

import (
	"context"
	"strconv"
	"strings"
	"sync"

	"github.com/redis/go-redis/v9"
)

// masterRound is what a round learned of one Cluster master.
type masterRound struct {
	addr     string
	id       string   // its master_replid
	replicas int      // connected
	slots    [][2]int // the ranges it serves, by its own account
	acked    bool     // a replica acknowledged the barrier
	changed  bool     // a slot of it had another master at the last round
}

// clusterRoundUpTo is roundUpTo on Redis Cluster.
func (j *journal) clusterRoundUpTo(ctx context.Context, upTo uint64, pending int) {
	var mu sync.Mutex
	var masters []masterRound
	failed := false
	_ = j.s.cluster.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
		r, err := masterRoundOn(ctx, m, pending > 0)
		mu.Lock()
		defer mu.Unlock()
		if err != nil {
			failed = true
			return err
		}
		masters = append(masters, r)
		return nil
	})
	if failed {
		// A master that does not answer may have failed over: the
		// client learns the new map of slots for the next round.
		j.s.cluster.ReloadState(ctx)
	}
	if len(masters) == 0 {
		return // the charges stay
	}
	j.mu.Lock()
	changed := j.ownersLocked(masters)
	if changed != nil {
		var keep []journalEntry
		for _, e := range j.entries {
			if changed[e.slot] {
				j.redo = append(j.redo, e)
			} else {
				keep = append(keep, e)
			}
		}
		j.entries, j.redo = keep, bySeq(j.redo)
	}
	resent := j.resolveUnsureLocked()
	redo := len(j.redo)
	j.mu.Unlock()
	j.s.m.ChargeJournal(JournalResent, resent)
	if changed != nil {
		j.s.log.Warn("redis cluster: a slot's master changed: re-applying the usage charges no replica had acknowledged",
			"slots", len(changed), "charges", redo)
	}
	if redo > 0 {
		j.reapply(ctx)
	}
	least := -1
	for _, m := range masters {
		if least < 0 || m.replicas < least {
			least = m.replicas
		}
		gone := j.replicaGone(m.id, m.replicas)
		switch {
		case m.changed || pending == 0:
		case m.replicas == 0:
			if gone {
				j.confirmWhere(upTo, JournalNoReplica, m.serves)
			}
		case m.acked:
			j.confirmWhere(upTo, JournalConfirmed, m.serves)
		}
	}
	j.noteReplicas(least)
}

// masterRoundOn reads m's identity and slots, then, with barrier, writes
// a barrier in one of its slots and waits for a replica, all on one
// connection: a change is seen before a barrier is waited for.
func masterRoundOn(ctx context.Context, m *redis.Client, barrier bool) (masterRound, error) {
	conn := m.Conn()
	defer conn.Close()
	r := masterRound{addr: m.Options().Addr}
	var err error
	if r.id, r.replicas, err = masterInfo(ctx, conn); err != nil {
		return r, err
	}
	nodes, err := conn.ClusterNodes(ctx).Result()
	if err != nil {
		return r, err
	}
	r.slots = ownSlots(nodes)
	if barrier && r.replicas > 0 && len(r.slots) > 0 {
		acked, err := barrierOn(ctx, conn, "{"+tagIn(r.slots[0])+"}"+barrierChannel)
		r.acked = err == nil && acked >= journalReplicas
	}
	return r, nil
}

// ownersLocked records which master serves each slot, and returns the
// slots whose master differs from the last round's (nil: none), marking
// the masters that serve one changed. Called with j.mu held.
func (j *journal) ownersLocked(masters []masterRound) map[int]bool {
	if j.owners == nil {
		j.owners = make([]string, 16384)
	}
	var changed map[int]bool
	for i := range masters {
		m := &masters[i]
		for _, r := range m.slots {
			for sl := r[0]; sl <= r[1]; sl++ {
				if was := j.owners[sl]; was != "" && was != m.id {
					if changed == nil {
						changed = map[int]bool{}
					}
					changed[sl] = true
					m.changed = true
				}
				j.owners[sl] = m.id
			}
		}
	}
	return changed
}

// serves reports that m serves slot.
func (m *masterRound) serves(slot int) bool {
	for _, r := range m.slots {
		if slot >= r[0] && slot <= r[1] {
			return true
		}
	}
	return false
}

// ownSlots returns the slot ranges the node answering CLUSTER NODES
// serves (its "myself" line; a slot being imported or migrated, in
// brackets, is not counted).
func ownSlots(nodes string) [][2]int {
	for line := range strings.Lines(nodes) {
		f := strings.Fields(line)
		if len(f) < 8 || !strings.Contains(f[2], "myself") {
			continue
		}
		var out [][2]int
		for _, s := range f[8:] {
			lo, hi, ok := strings.Cut(s, "-")
			a, err := strconv.Atoi(lo)
			if err != nil {
				continue
			}
			b := a
			if ok {
				if b, err = strconv.Atoi(hi); err != nil {
					continue
				}
			}
			out = append(out, [2]int{a, b})
		}
		return out
	}
	return nil
}

// tagIn returns a hash tag whose slot is in r.
func tagIn(r [2]int) string {
	for n := 0; ; n++ {
		tag := strconv.Itoa(n)
		if sl := slot(tag); sl >= r[0] && sl <= r[1] {
			return tag
		}
	}
}
