package memstore

import (
	"github.com/driplimit/drip/bucket"
)

// The blocks of leased tokens of a key (bucket.Block) are held in its
// shard's blocks map under the shard's lock, beside its bucket in the
// table: a take on a key with blocks is decided by bucket.EvalBlocks,
// under the cap they put on the bucket. The map has the bound on keys
// (WithMaxKeys) of its own: a block take on a new key in a full shard,
// after the expired blocks are swept, is denied (its instance then takes
// per decision). A key holds at most bucket.MaxBlocks blocks. Should the
// bucket of a key with blocks be evicted, it comes back full up to the
// cap of its blocks, never above it.

// applyBlocks decides the item it on the held key (hash h) at now, under
// its blocks. The caller holds sh.mu.
func (s *Store) applyBlocks(sh *shard, h uint64, key string, op bucket.Op, it *bucket.Prepared, now int64) bucket.Result {
	i, found := sh.find(h, key)
	var b bucket.State
	if found {
		b = sh.slots[i].b
	}
	bs := sh.blocks[key]
	if it.Block != "" && op == bucket.Take && bs == nil && len(sh.blocks) >= s.maxKeys {
		s.sweepBlocks(sh, now)
		if len(sh.blocks) >= s.maxKeys {
			r, _, _ := bucket.Eval(bucket.Peek, b, found, it.Params, it.Cost, false, now)
			r.Allowed = false
			return r
		}
	}
	r, next, nbs, write := bucket.EvalBlocks(op, b, found, bs, it, now)
	if write {
		s.write(sh, h, key, next, it.Params.StateExpiresAt(next, nbs), now)
		s.putBlocks(sh, key, nbs)
	}
	return r
}

// putBlocks stores the blocks bs of the held key, or drops the key when
// it has none. The caller holds sh.mu.
func (s *Store) putBlocks(sh *shard, key string, bs []bucket.Block) {
	if len(bs) == 0 {
		delete(sh.blocks, key)
		return
	}
	if sh.blocks == nil {
		sh.blocks = map[string][]bucket.Block{}
	}
	sh.blocks[key] = bs
}

// sweepBlocks drops the blocks of keys whose blocks have all expired by
// n and whose bucket is gone (expired, or evicted): while the bucket is
// held its blocks stay, however old, since they cap its refill until
// their expiries (bucket.Params.StateExpiresAt, the bucket's own expiry,
// counts them). The caller holds sh.mu.
func (s *Store) sweepBlocks(sh *shard, n int64) {
	for k, v := range sh.blocks {
		if bucket.BlocksExpireAt(v) > n {
			continue
		}
		if _, h := s.locate(k); !sh.has(h, k) {
			delete(sh.blocks, k)
		}
	}
}

// has reports whether the shard holds a bucket under the held key.
func (sh *shard) has(h uint64, key string) bool {
	_, ok := sh.find(h, key)
	return ok
}
