package storetest

import (
	"math/big"
	"time"

	"github.com/driplimit/drip/bucket"
)

// The model of a sliding window (docs/semantics.md), written from the
// definition rather than from bucket.EvalSliding: a key keeps a log of
// every take it allowed, each entry the slot it was counted in. Slot k
// begins at k*slot + start, start the grid's offset (Params.Start modulo
// the slot, 0 but on a moved grid). A decision at now counts in slot
// j = max(floor((now-start)/slot), the newest slot written) (a clock that
// went back decides as in the newest slot); the window of a
// decision is the slots j-Slots to j, and what it counts is the entries in
// them. A take or peek is allowed when that count plus its cost is within
// the limit; a denial's retry is the first later slot boundary at which
// enough entries have left; a refund gives back from the newest entries of
// the window first; reset is when the newest entry leaves.

// slidingLog is one key's log.
type slidingLog struct {
	entries []slidingEntry
	last    int64 // the newest slot written
	wrote   bool
}

type slidingEntry struct{ slot, cost int64 }

// used is what the log counts in the window that ends in slot j.
func (l *slidingLog) used(j, slots int64) int64 {
	var n int64
	for _, e := range l.entries {
		if e.slot >= j-slots && e.slot <= j {
			n += e.cost
		}
	}
	return n
}

func (m *Model) applySliding(op bucket.Op, p bucket.Prepared, at time.Time, write bool) ModelDecision {
	limit, slots := p.Params.Burst, p.Params.Parts
	slot := (p.Params.Period-1)/slots + 1 // ceil, without overflow
	now := at.UnixNano()
	l := m.logs[p.Key]
	if l == nil {
		l = &slidingLog{}
	}
	// In big integers: now-start may lie outside int64.
	start := new(big.Int).Mod(big.NewInt(p.Params.Start), big.NewInt(slot))
	jb := new(big.Int).Sub(big.NewInt(now), start)
	jb.Div(jb, big.NewInt(slot)) // Euclidean: floor, for slot > 0
	j := jb.Int64()
	if l.wrote && l.last > j {
		j = l.last
	}
	used := l.used(j, slots)
	d := ModelDecision{Burst: big.NewRat(limit, bucket.Micro), Cost: big.NewRat(p.Cost, bucket.Micro), RetryNs: new(big.Rat)}
	entries := l.entries
	switch {
	case op == bucket.Refund:
		d.Allowed = true
		entries = append([]slidingEntry(nil), l.entries...)
		cost := p.Cost
		for i := len(entries) - 1; i >= 0 && cost > 0; i-- {
			if entries[i].slot < j-slots {
				break
			}
			g := min(cost, entries[i].cost)
			entries[i].cost -= g
			cost -= g
			used -= g
		}
	case used+p.Cost > limit:
		for t := j + 1; ; t++ {
			if l.used(t, slots)+p.Cost <= limit {
				d.RetryNs = slotFrom(t, slot, start, now)
				break
			}
		}
	default:
		// A peek answers as the take would, and writes nothing.
		d.Allowed = true
		entries = append(append([]slidingEntry(nil), l.entries...), slidingEntry{j, p.Cost})
		used += p.Cost
	}
	d.Tokens = big.NewRat(limit-used, bucket.Micro)
	// Reset: when the newest entry of the window with a count leaves it.
	d.ResetNs = new(big.Rat)
	for i := len(entries) - 1; i >= 0; i-- {
		if e := entries[i]; e.cost > 0 && e.slot >= j-slots {
			d.ResetNs = slotFrom(e.slot+slots+1, slot, start, now)
			break
		}
	}
	if write && d.Allowed && op != bucket.Peek {
		// Entries that have left every window to come are dropped.
		kept := entries[:0:0]
		for _, e := range entries {
			if e.slot >= j-slots {
				kept = append(kept, e)
			}
		}
		m.logs[p.Key] = &slidingLog{entries: kept, last: j, wrote: true}
	}
	return d
}

// slotFrom is how long after now slot k begins (at k*slot + start),
// exactly: with slots of years, it may lie past the last instant of int64
// nanoseconds.
func slotFrom(k, slot int64, start *big.Int, now int64) *big.Rat {
	b := new(big.Int).Mul(big.NewInt(k), big.NewInt(slot))
	b.Add(b, start)
	return new(big.Rat).SetInt(b.Sub(b, big.NewInt(now)))
}
