package memstore

import (
	"time"

	"github.com/driplimit/drip/bucket"
)

// A concurrency limit's state is a set of leases (bucket.Lease) per key,
// held in its shard's leases map under the shard's lock, apart from the
// token buckets of the table: a key names a bucket or a lease set, and the
// two never meet. Lease sets have a bound of their own, the bound on keys
// (WithMaxKeys): a shard holds at most that many sets beside its buckets.
// A set holds at most the limit's MaxInFlight leases of at most
// store.MaxLeaseLen bytes each: its size is fixed by the limit, not by
// callers. Expired sets are dropped by Sweep (and on insert into a full
// shard).

// applyLeases decides one request on a concurrency limit (p, lease id
// checked by the caller).
func (s *Store) applyLeases(op bucket.Op, at time.Time, key string, p *bucket.Params, id string) bucket.Result {
	now := s.nanos(at)
	key = held(key)
	sh, _ := s.locate(key)
	sh.mu.Lock()
	ls := sh.leases[key]
	r, write := p.EvalLeases(op, bucket.Leases(ls, id, now), id, now)
	if write {
		s.putLeases(sh, key, p.NextLeases(op, ls, id, now), now)
	}
	sh.mu.Unlock()
	return r
}

// putLeases stores the lease set ls of the held key, or drops the key
// when ls is empty. A new key in a shard at its bound first drops the
// sets that have expired, then, if the shard is still full, the set of a
// sample that expires first (its holders lose their slots early: the
// price of bounded memory, as for an evicted bucket). The caller holds
// sh.mu.
func (s *Store) putLeases(sh *shard, key string, ls []bucket.Lease, now int64) {
	if len(ls) == 0 {
		delete(sh.leases, key)
		return
	}
	if sh.leases == nil {
		sh.leases = map[string][]bucket.Lease{}
	}
	if _, ok := sh.leases[key]; !ok && len(sh.leases) >= s.maxKeys {
		sh.sweepLeases(now)
		if len(sh.leases) >= s.maxKeys {
			victim, exp, seen := "", int64(0), 0
			for k, v := range sh.leases {
				if e := bucket.LeasesExpireAt(v); victim == "" || e < exp {
					victim, exp = k, e
				}
				if seen++; seen == evictSample {
					break
				}
			}
			delete(sh.leases, victim)
		}
	}
	sh.leases[key] = ls
}

// sweepLeases drops the lease sets whose leases have all expired by n,
// and says how many. The caller holds sh.mu.
func (sh *shard) sweepLeases(n int64) int {
	dropped := 0
	for k, v := range sh.leases {
		if bucket.LeasesExpireAt(v) <= n {
			delete(sh.leases, k)
			dropped++
		}
	}
	return dropped
}
