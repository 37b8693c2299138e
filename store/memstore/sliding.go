package memstore

import (
	"time"

	"github.com/driplimit/drip/bucket"
)

// A sliding window's state (bucket.SlidingState: a count per slot) is
// held per key in its shard's windows map under the shard's lock, apart
// from the token buckets of the table, as lease sets are; a key holds
// one of them at a time (dropOthers). The map has the
// bound on keys of its own (WithMaxKeys), and a state holds Slots+1
// counts, at most bucket.MaxSlots+1: its size is fixed by the limit, not
// by callers. Expired states are dropped by Sweep (and on insert into a
// full shard).

// window is a sliding window's state and the instant it expires.
type window struct {
	s   bucket.SlidingState
	exp int64
}

// applySliding decides one request on a sliding window.
func (s *Store) applySliding(op bucket.Op, at time.Time, it *bucket.Prepared) bucket.Result {
	now := s.nanos(at)
	key := held(it.Key)
	sp := it.Params.Sliding()
	sh, _ := s.locate(key)
	sh.mu.Lock()
	w, found := sh.windows[key]
	r, next, write := bucket.EvalSliding(op, w.s, found, sp, it.Cost, now)
	if write {
		s.putWindow(sh, key, next, sp.SlidingExpiresAt(next), now)
	}
	sh.mu.Unlock()
	return r
}

// putWindow stores the state of the held key's sliding window. A new key
// in a shard at its bound first drops the expired states, then, if the
// shard is still full, the state of a sample that expires first (its
// counts are lost early: the price of bounded memory, as for an evicted
// bucket). The caller holds sh.mu.
func (s *Store) putWindow(sh *shard, key string, st bucket.SlidingState, exp, now int64) {
	if sh.windows == nil {
		sh.windows = map[string]window{}
	}
	_, had := sh.windows[key]
	if !had {
		s.dropOthers(sh, key, shapeSliding)
	}
	if !had && len(sh.windows) >= s.maxKeys {
		sh.sweepWindows(now)
		if len(sh.windows) >= s.maxKeys {
			victim, first, seen := "", int64(0), 0
			for k, v := range sh.windows {
				if victim == "" || v.exp < first {
					victim, first = k, v.exp
				}
				if seen++; seen == evictSample {
					break
				}
			}
			delete(sh.windows, victim)
		}
	}
	sh.windows[key] = window{s: st, exp: exp}
}

// sweepWindows drops the sliding window states that expired by n, and
// says how many. The caller holds sh.mu.
func (sh *shard) sweepWindows(n int64) int {
	dropped := 0
	for k, v := range sh.windows {
		if v.exp <= n {
			delete(sh.windows, k)
			dropped++
		}
	}
	return dropped
}
