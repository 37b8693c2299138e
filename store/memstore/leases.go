package memstore

import (
	"container/heap"
	"time"

	"github.com/driplimit/drip/bucket"
)

// A concurrency limit's state is a set of leases per key, held in its
// shard's lease table under the shard's lock, apart from the token buckets
// of the table: a key holds one or the other (a set made for a key drops
// its bucket, and a bucket made for it drops its set: see dropOthers). Lease sets have a bound of their own, the bound on keys
// (WithMaxKeys): a shard holds at most that many sets beside its buckets.
// A set holds at most the limit's MaxInFlight leases of at most
// store.MaxLeaseLen bytes each: its size is fixed by the limit, not by
// callers.
//
// Nothing here costs time linear in the leases of a key or the sets of a
// shard. A set keeps its leases by ID and in two heaps by expiry (the
// earliest on top of one, the latest on top of the other), so that what
// bucket.Leases summarizes is read in constant time, plus one step per
// lease that expired since the set was last written (a write drops them:
// a denial, which writes nothing, finds none under an unchanged limit,
// since a write leaves at most Slots live leases and a denial needs that
// many), and an acquire or release is a few heap steps, logarithmic in
// the leases held. A shard keeps its sets in a heap by when their last
// lease expires, so that the sweep and the eviction of a full shard pop
// the sets that expire first instead of walking the shard.

// leaseTable is a shard's lease sets.
type leaseTable struct {
	sets  map[string]*leaseSet
	byExp setHeap // by exp, the earliest on top
}

// leaseSet is the leases of one key; exp is when the last of them
// expires (bucket.LeasesExpireAt) and at its place in leaseTable.byExp.
// A set of up to smallSet leases finds a lease by walking them and keeps
// its heaps in fb and lb: a new key costs two allocations, the set and its
// lease.
type leaseSet struct {
	key    string
	exp    int64
	at     int
	byID   map[string]*leaseEntry // nil while at most smallSet leases
	first  leaseHeap              // the earliest expiry on top
	last   leaseHeap              // the latest expiry on top
	fb, lb [2]*leaseEntry
}

const smallSet = 8

// newLeaseSet is an empty set for the held key.
func newLeaseSet(key string) *leaseSet {
	ls := &leaseSet{key: key, last: leaseHeap{desc: true}}
	ls.first.hs, ls.last.hs = ls.fb[:0], ls.lb[:0]
	return ls
}

// find is the set's lease id.
func (ls *leaseSet) find(id string) (*leaseEntry, bool) {
	if ls.byID != nil {
		l, ok := ls.byID[id]
		return l, ok
	}
	for _, l := range ls.first.hs {
		if l.id == id {
			return l, true
		}
	}
	return nil, false
}

// leaseEntry is one lease of a set and its places in the set's two heaps.
type leaseEntry struct {
	id  string
	exp int64
	at  [2]int // in first, in last
}

// leaseHeap is a heap of leases by expiry: the earliest on top (slot 0)
// or, with desc, the latest. It keeps each lease's place in it.
type leaseHeap struct {
	hs   []*leaseEntry
	desc bool
}

func (h *leaseHeap) slot() int {
	if h.desc {
		return 1
	}
	return 0
}
func (h *leaseHeap) Len() int { return len(h.hs) }
func (h *leaseHeap) Less(i, j int) bool {
	if h.desc {
		return h.hs[i].exp > h.hs[j].exp
	}
	return h.hs[i].exp < h.hs[j].exp
}
func (h *leaseHeap) Swap(i, j int) {
	h.hs[i], h.hs[j] = h.hs[j], h.hs[i]
	h.hs[i].at[h.slot()] = i
	h.hs[j].at[h.slot()] = j
}
func (h *leaseHeap) Push(x any) {
	l := x.(*leaseEntry)
	l.at[h.slot()] = len(h.hs)
	h.hs = append(h.hs, l)
}
func (h *leaseHeap) Pop() any {
	l := h.hs[len(h.hs)-1]
	h.hs[len(h.hs)-1] = nil
	h.hs = h.hs[:len(h.hs)-1]
	return l
}

// setHeap is a heap of lease sets by exp, the earliest on top.
type setHeap []*leaseSet

func (h setHeap) Len() int           { return len(h) }
func (h setHeap) Less(i, j int) bool { return h[i].exp < h[j].exp }
func (h setHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].at, h[j].at = i, j
}
func (h *setHeap) Push(x any) {
	ls := x.(*leaseSet)
	ls.at = len(*h)
	*h = append(*h, ls)
}
func (h *setHeap) Pop() any {
	old := *h
	ls := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	return ls
}

// summary is bucket.Leases of the set for lease id at now.
func (ls *leaseSet) summary(id string, now int64) bucket.LeaseSet {
	var s bucket.LeaseSet
	if ls == nil || len(ls.last.hs) == 0 || ls.last.hs[0].exp <= now {
		return s // none live
	}
	expired, earliest := ls.first.below(0, now)
	s.Live = int64(len(ls.first.hs)) - expired
	s.Earliest = earliest
	s.Latest = ls.last.hs[0].exp
	if l, ok := ls.find(id); ok && id != "" && l.exp > now {
		s.Held = true
	}
	return s
}

// below counts the leases at or under slot i of an earliest-first heap
// that expired by now, and returns the earliest expiry after now among
// them (0: none). It visits only the expired leases and their children.
func (h *leaseHeap) below(i int, now int64) (expired, earliest int64) {
	if i >= len(h.hs) {
		return 0, 0
	}
	if e := h.hs[i].exp; e > now {
		return 0, e
	}
	n1, e1 := h.below(2*i+1, now)
	n2, e2 := h.below(2*i+2, now)
	if e1 == 0 || (e2 != 0 && e2 < e1) {
		e1 = e2
	}
	return 1 + n1 + n2, e1
}

// remove takes l out of the set.
func (ls *leaseSet) remove(l *leaseEntry) {
	heap.Remove(&ls.first, l.at[0])
	heap.Remove(&ls.last, l.at[1])
	if ls.byID != nil {
		delete(ls.byID, l.id)
	}
}

// next is bucket.Params.NextLeases on the set: the leases expired by now
// dropped, then lease id acquired or renewed (Take) or released (Refund).
func (ls *leaseSet) next(p *bucket.Params, op bucket.Op, id string, now int64) {
	for len(ls.first.hs) > 0 && ls.first.hs[0].exp <= now {
		ls.remove(ls.first.hs[0])
	}
	l, ok := ls.find(id)
	switch {
	case op == bucket.Refund && ok:
		ls.remove(l)
	case op == bucket.Take && ok:
		l.exp = p.LeaseExp(now)
		heap.Fix(&ls.first, l.at[0])
		heap.Fix(&ls.last, l.at[1])
	case op == bucket.Take:
		l = &leaseEntry{id: id, exp: p.LeaseExp(now)}
		heap.Push(&ls.first, l)
		heap.Push(&ls.last, l)
		switch {
		case ls.byID != nil:
			ls.byID[id] = l
		case len(ls.first.hs) > smallSet:
			ls.byID = make(map[string]*leaseEntry, 2*smallSet)
			for _, l := range ls.first.hs {
				ls.byID[l.id] = l
			}
		}
	}
}

// leases is the lease set of the held key in sh (nil: none).
func (sh *shard) leaseSet(key string) *leaseSet {
	if sh.leases == nil {
		return nil
	}
	return sh.leases.sets[key]
}

// leaseCount is how many lease sets sh holds.
func (sh *shard) leaseCount() int {
	if sh.leases == nil {
		return 0
	}
	return len(sh.leases.sets)
}

// applyLeases decides one request on a concurrency limit (p, lease id
// checked by the caller).
func (s *Store) applyLeases(op bucket.Op, at time.Time, key string, p *bucket.Params, id string) bucket.Result {
	now := s.nanos(at)
	key = held(key)
	sh, _ := s.locate(key)
	sh.mu.Lock()
	r, write := p.EvalLeases(op, sh.leaseSet(key).summary(id, now), id, now)
	if write {
		s.writeLeases(sh, key, p, op, id, now)
	}
	sh.mu.Unlock()
	return r
}

// writeLeases writes a decision that EvalLeases said to write on the held
// key's set (bucket.Params.NextLeases), and drops the key when no lease
// is left. A new key in a shard at its bound first drops the sets that
// have expired, then, if the shard is still full, the set that expires
// first (its holders lose their slots early: the price of bounded memory,
// as for an evicted bucket). The caller holds sh.mu.
func (s *Store) writeLeases(sh *shard, key string, p *bucket.Params, op bucket.Op, id string, now int64) {
	t := sh.leases
	if t == nil {
		if op != bucket.Take {
			return
		}
		t = &leaseTable{sets: map[string]*leaseSet{}}
		sh.leases = t
	}
	ls, ok := t.sets[key]
	if !ok {
		if op != bucket.Take {
			return // a release on a key without leases leaves none
		}
		if len(t.sets) >= s.maxKeys {
			sh.sweepLeases(now)
			if len(t.sets) >= s.maxKeys {
				t.drop(t.byExp[0])
			}
		}
		s.dropOthers(sh, key, shapeLeases)
		ls = newLeaseSet(key)
		t.sets[key] = ls
		heap.Push(&t.byExp, ls)
	}
	ls.next(p, op, id, now)
	if len(ls.last.hs) == 0 {
		t.drop(ls)
		return
	}
	ls.exp = ls.last.hs[0].exp
	heap.Fix(&t.byExp, ls.at)
}

// drop takes the set ls out of the table.
func (t *leaseTable) drop(ls *leaseSet) {
	heap.Remove(&t.byExp, ls.at)
	delete(t.sets, ls.key)
}

// dropLeases drops the held key's lease set, if any. The caller holds
// sh.mu.
func (sh *shard) dropLeases(key string) {
	if ls := sh.leaseSet(key); ls != nil {
		sh.leases.drop(ls)
	}
}

// sweepLeases drops the lease sets whose leases have all expired by n,
// and says how many: those on top of the heap, so the cost is the sets
// dropped, not the sets held. The caller holds sh.mu.
func (sh *shard) sweepLeases(n int64) int {
	t := sh.leases
	if t == nil {
		return 0
	}
	dropped := 0
	for len(t.byExp) > 0 && t.byExp[0].exp <= n {
		t.drop(t.byExp[0])
		dropped++
	}
	return dropped
}
