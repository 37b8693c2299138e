// Package memstore is drip's embedded store: bucket state in process
// memory, for one process. It is the default of drip serve and drip replay.
//
// Keys are spread over shards, each with its own lock, so that decisions on
// different keys rarely contend. Idle buckets are dropped once they would be
// full again, and memory is bounded twice: by the number of buckets
// (WithMaxKeys) and by their bytes, keys counted by their length
// (WithMaxBytes). A key longer than MaxKeyLen bytes (or starting with the
// byte 0xff) is held as 0xff followed by its SHA-256, as the PostgreSQL
// store does, so no key, however long, costs more than MaxKeyLen bytes.
//
// When a shard is at its bound, a new bucket evicts: the store examines a
// sample of the shard's buckets (those next to where the new key goes,
// which the hash makes random) and drops the first one that is already
// full again, or else the one nearest to full. An attacker sending endless
// new keys thus costs bounded memory and a fixed amount of work per key,
// and evicts the buckets that carry the least information. An evicted
// bucket that was not full comes back full: the bound trades that much
// over-admission for bounded memory.
//
// Concurrency limits keep a set of leases per key beside the buckets,
// under the same shard locks (see leases.go), so a multi-take mixing both
// is one atomic step.
package memstore

import (
	"context"
	"crypto/sha256"
	"hash/maphash"
	"slices"
	"sync"
	"time"

	"github.com/driplimit/drip/bucket"
	"github.com/driplimit/drip/store"
)

// DefaultMaxKeys is the default bound on the number of buckets.
const DefaultMaxKeys = 1 << 20

// DefaultMaxBytes is the default bound on the bytes the buckets take: 256
// MiB, so that with keys of up to 128 bytes the bound on buckets binds
// first. A bucket counts BucketBytes plus the length of its key.
const DefaultMaxBytes = 256 << 20

// BucketBytes is what one bucket counts against the bound on bytes besides
// its key: its 64-byte slot in a table kept between 3/8 and 3/4 full, so
// about 128 bytes.
const BucketBytes = 128

// MaxKeyLen is the longest key held as it is; longer keys are held hashed
// (see the package doc).
const MaxKeyLen = 512

const (
	shardCount  = 256
	evictSample = 8
)

// Store is the in-memory store. The zero value is not usable; call New.
// It is safe for concurrent use.
type Store struct {
	seed       maphash.Seed
	now        func() time.Time // nil: the monotonic clock below
	start      time.Time        // wall time at New, with its monotonic reading
	maxKeys    int              // per shard
	maxBytes   int              // per shard
	shards     [shardCount]shard
	stop       chan struct{}
	stopOnce   sync.Once
	sweepEvery time.Duration
	ov         overrides // override.go
	board      board     // board.go
}

var (
	_ store.Store    = (*Store)(nil)
	_ store.Admitter = (*Store)(nil)
)

// Option configures a Store.
type Option func(*Store)

// WithMaxKeys bounds the number of buckets held (default DefaultMaxKeys).
// The bound is kept shard by shard, each holding up to n/256 (rounded up).
func WithMaxKeys(n int) Option {
	return func(s *Store) { s.maxKeys = max(1, (n+shardCount-1)/shardCount) }
}

// WithMaxBytes bounds the bytes the buckets take, each counting
// BucketBytes plus the length of its key (at most MaxKeyLen), default
// DefaultMaxBytes. The bound is kept shard by shard, each holding n/256
// bytes but room for at least one bucket of the longest key, so the bound
// is never below 256*(BucketBytes+MaxKeyLen), 160 KiB.
func WithMaxBytes(n int) Option {
	return func(s *Store) { s.maxBytes = max(BucketBytes+MaxKeyLen, n/shardCount) }
}

// WithClock sets the clock used when a decision is made without a time.
// By default the store reads the wall clock once, at New, and counts from
// there on the monotonic clock: decisions never see the wall clock step
// back or jump, and reading it costs one call instead of two. Either clock
// is read to the microsecond, as the servers of the other stores read
// theirs; a decision given its time keeps its nanoseconds.
func WithClock(now func() time.Time) Option { return func(s *Store) { s.now = now } }

// WithSweep sets how often expired buckets are swept away (default one
// minute; 0 disables the sweeper, leaving eviction on insert only).
func WithSweep(every time.Duration) Option {
	return func(s *Store) { s.sweepEvery = every }
}

// New returns an empty store. Call Close to stop its sweeper.
func New(opts ...Option) *Store {
	s := &Store{seed: maphash.MakeSeed(), start: time.Now(), stop: make(chan struct{})}
	WithMaxKeys(DefaultMaxKeys)(s)
	WithMaxBytes(DefaultMaxBytes)(s)
	s.sweepEvery = time.Minute
	for _, o := range opts {
		o(s)
	}
	if s.sweepEvery > 0 {
		go s.sweeper(s.sweepEvery)
	}
	return s
}

// Close stops the sweeper. The store stays usable.
func (s *Store) Close() error {
	s.stopOnce.Do(func() { close(s.stop) })
	return nil
}

func (s *Store) sweeper(every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
			s.Sweep(time.Unix(0, s.clock()))
		}
	}
}

// SweepMargin is how long after a bucket expires (bucket.Params.ExpiresAt)
// the sweeper drops it. Until then a decision made with a clock that went
// back a little still sees the bucket's own ts.
const SweepMargin = time.Minute

// Sweep drops every bucket that expired SweepMargin before now. It locks
// one shard at a time.
func (s *Store) Sweep(now time.Time) int {
	n := now.Add(-SweepMargin).UnixNano()
	dropped := 0
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		dropped += sh.sweepLeases(n)
		dropped += sh.sweepWindows(n)
		for j := 0; j < len(sh.slots); {
			if sh.slots[j].hash != 0 && sh.slots[j].exp <= n {
				sh.remove(j) // and look at j again: remove may move a slot there
				dropped++
				continue
			}
			j++
		}
		s.sweepBlocks(sh, n) // after the buckets: see there
		sh.mu.Unlock()
	}
	return dropped
}

// Len is the number of buckets held, lease sets of concurrency limits
// and states of sliding windows included.
func (s *Store) Len() int {
	return s.sum(func(sh *shard) int { return sh.n + sh.leaseCount() + len(sh.windows) })
}

// Bytes is what the buckets held count against the bound on bytes (see
// WithMaxBytes).
func (s *Store) Bytes() int { return s.sum(func(sh *shard) int { return sh.bytes }) }

// sum adds f over the shards, each read under its lock.
func (s *Store) sum(f func(*shard) int) int {
	n := 0
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		n += f(sh)
		sh.mu.Unlock()
	}
	return n
}

// held is the key under which key's bucket is held: key itself, or for a
// key longer than MaxKeyLen or starting with 0xff, 0xff and its SHA-256
// (one allocation, for such keys only).
func held(key string) string {
	if len(key) <= MaxKeyLen && (len(key) == 0 || key[0] != 0xff) {
		return key
	}
	h := sha256.New()
	var buf [4096]byte
	for rest := key; len(rest) > 0; {
		n := copy(buf[:], rest)
		h.Write(buf[:n])
		rest = rest[n:]
	}
	return string(h.Sum(append(make([]byte, 0, 1+sha256.Size), 0xff)))
}

// locate hashes the held key: its shard, and its hash in the shard's
// table (never 0, which marks a free slot).
func (s *Store) locate(key string) (*shard, uint64) {
	h := maphash.String(s.seed, key)
	return &s.shards[h%shardCount], h | 1<<63
}

func (s *Store) nanos(at time.Time) int64 {
	if at.IsZero() {
		return s.clock()
	}
	return at.UnixNano()
}

// clock is the store's clock in nanoseconds, on the microsecond, as the
// servers' clocks are (Redis TIME, PostgreSQL's clock_timestamp): so that
// a decision at the store's time answers the same on every store (a lease
// expires on the microsecond, and its reset_after would otherwise carry
// the nanoseconds of the instant).
func (s *Store) clock() int64 {
	var n int64
	if s.now != nil {
		n = s.now().UnixNano()
	} else {
		n = s.start.UnixNano() + int64(time.Since(s.start))
	}
	return n - n%1000
}

// Caps implements store.Store: the store decides in process, holds
// leases, sliding and calendar windows, blocks of leased tokens, and
// keeps overrides (override.go).
func (s *Store) Caps() store.Caps {
	return store.Caps{Name: "memstore", Admit: s, InProcess: true, Leases: true, Sliding: true, Calendar: true, Blocks: true, Overrides: s, Board: s}
}

// Apply implements store.Store. One item is decided here, under its
// shard's lock (the hot path: no call more); several under the locks of
// all their shards (applyMulti); a concurrency limit's by applyLeases,
// a sliding window's by applySliding.
func (s *Store) Apply(_ context.Context, op bucket.Op, at time.Time, items []bucket.Prepared, results []bucket.Result) error {
	if len(items) != 1 {
		s.applyMulti(op, at, items, results)
		return nil
	}
	it := &items[0]
	p := &it.Params
	switch p.Kind {
	case bucket.Concurrency:
		results[0] = s.applyLeases(op, at, it.Key, p, it.Lease)
		return nil
	case bucket.Sliding:
		results[0] = s.applySliding(op, at, it)
		return nil
	}
	results[0] = s.decide(op, it, p, at)
	return nil
}

// ApplyOne implements store.Admitter: Apply of one item of a token
// bucket or fixed window, on the same path.
func (s *Store) ApplyOne(op bucket.Op, key string, p *bucket.Params, cost int64, reserve bool, at time.Time) bucket.Result {
	it := bucket.Prepared{Key: key, Cost: cost, Reserve: reserve}
	return s.decide(op, &it, p, at)
}

// decide is Apply of it, an item of a token bucket or fixed window under p
// (it.Params, or the caller's copy of them).
func (s *Store) decide(op bucket.Op, it *bucket.Prepared, p *bucket.Params, at time.Time) bucket.Result {
	now := s.nanos(at)
	key := held(it.Key)
	sh, h := s.locate(key)
	sh.mu.Lock()
	if it.Block != "" || len(sh.blocks) > 0 && sh.blocks[key] != nil {
		it.Params = *p
		r := s.applyBlocks(sh, h, key, op, it, now)
		sh.mu.Unlock()
		return r
	}
	i, found := sh.find(h, key)
	var b bucket.State
	if found {
		b = sh.slots[i].b
	}
	r, next, write := bucket.Eval(op, b, found, *p, it.Cost, it.Reserve, now)
	if write {
		s.keep(sh, i, found, h, key, next, p.ExpiresAt(next), now)
	}
	sh.mu.Unlock()
	return r
}

// Admit implements store.Admitter: a take of cost micro-tokens from key's
// bucket under p, decided by bucket.Admit (Eval's decision without the
// waits), and whether it was allowed.
func (s *Store) Admit(key string, p *bucket.Params, cost int64, at time.Time) bool {
	now := s.nanos(at)
	key = held(key)
	sh, h := s.locate(key)
	sh.mu.Lock()
	if len(sh.blocks) > 0 && sh.blocks[key] != nil {
		// The key holds blocks of leased tokens, which cap its refill:
		// decide as Apply does.
		r := s.applyBlocks(sh, h, key, bucket.Take, &bucket.Prepared{Params: *p, Cost: cost}, now)
		sh.mu.Unlock()
		return r.Allowed
	}
	i, found := sh.find(h, key)
	var b bucket.State
	if found {
		b = sh.slots[i].b
	}
	ok, next := bucket.Admit(b, found, *p, cost, now)
	if ok {
		s.keep(sh, i, found, h, key, next, p.ExpiresAt(next), now)
	}
	sh.mu.Unlock()
	return ok
}

// keep writes b under the held key, into slot i when found (sh.find's
// answer), else as a new bucket. The caller holds sh.mu.
func (s *Store) keep(sh *shard, i int, found bool, h uint64, key string, b bucket.State, exp, now int64) {
	if found {
		sl := &sh.slots[i]
		sl.b, sl.exp = b, exp
		return
	}
	s.put(sh, h, key, b, exp, now)
}

// write stores b under the held key, a bucket already there or a new one.
// The caller holds sh.mu.
func (s *Store) write(sh *shard, h uint64, key string, b bucket.State, exp, now int64) {
	if i, ok := sh.find(h, key); ok {
		sl := &sh.slots[i]
		sl.b, sl.exp = b, exp
		return
	}
	s.put(sh, h, key, b, exp, now)
}

// put adds a bucket under the held key (hash h), which the shard does not
// hold: it evicts while the shard is at its bounds, and grows the table
// while it is more than 3/4 full. The caller holds sh.mu.
func (s *Store) put(sh *shard, h uint64, key string, b bucket.State, exp, now int64) {
	for sh.n > 0 && (sh.n >= s.maxKeys || sh.bytes+size(len(key)) > s.maxBytes) {
		sh.remove(sh.victim(h, now))
	}
	if sh.full() {
		sh.grow()
	}
	sh.add(h, key, b, exp)
	s.dropOthers(sh, key, shapeBucket)
}

// applyMulti decides several items as one step. It locks the shards
// involved in a fixed order, so concurrent multi-takes never deadlock.
func (s *Store) applyMulti(op bucket.Op, at time.Time, ps []bucket.Prepared, results []bucket.Result) {
	now := s.nanos(at)
	keys := make([]string, len(ps))
	shards := make([]*shard, len(ps))
	hashes := make([]uint64, len(ps))
	// The shards involved, each once, in ascending order (a scan of all
	// 256 for the few a multi-take touches cost more than its decision).
	var buf [16]int
	order := buf[:0]
	for i, p := range ps {
		keys[i] = held(p.Key)
		shards[i], hashes[i] = s.locate(keys[i])
		if j, in := slices.BinarySearch(order, int(hashes[i]%shardCount)); !in {
			order = slices.Insert(order, j, int(hashes[i]%shardCount))
		}
	}
	for _, j := range order {
		s.shards[j].mu.Lock()
	}
	buckets := make([]bucket.State, len(ps))
	found := make([]bool, len(ps))
	var leases []bucket.LeaseSet
	var slides []bucket.SlidingState
	var blocks [][]bucket.Block
	for i, k := range keys {
		if ps[i].Params.Kind == bucket.Sliding {
			if slides == nil {
				slides = make([]bucket.SlidingState, len(ps))
			}
			slides[i] = shards[i].windows[k].s
			continue
		}
		var bs []bucket.Block
		if len(shards[i].blocks) > 0 { // no hash of the key when no key of the shard has blocks
			bs = shards[i].blocks[k]
		}
		if ps[i].Block != "" || bs != nil {
			if blocks == nil {
				blocks = make([][]bucket.Block, len(ps))
			}
			blocks[i] = bs
		}
		if ps[i].Params.Kind == bucket.Concurrency {
			if leases == nil {
				leases = make([]bucket.LeaseSet, len(ps))
			}
			leases[i] = shards[i].leaseSet(k).summary(ps[i].Lease, now)
			continue
		}
		if j, ok := shards[i].find(hashes[i], k); ok {
			buckets[i], found[i] = shards[i].slots[j].b, true
		}
	}
	res, next, nextSlides, nextBlocks, write := bucket.EvalMultiAll(op, ps, buckets, found, leases, slides, blocks, now)
	for i, p := range ps {
		switch {
		case !write[i]:
		case p.Params.Kind == bucket.Sliding:
			s.putWindow(shards[i], keys[i], nextSlides[i], p.Params.Sliding().SlidingExpiresAt(nextSlides[i]), now)
		case p.Params.Kind == bucket.Concurrency:
			s.writeLeases(shards[i], keys[i], &p.Params, op, p.Lease, now)
		case blocks != nil:
			s.write(shards[i], hashes[i], keys[i], next[i], p.Params.StateExpiresAt(next[i], nextBlocks[i]), now)
			s.putBlocks(shards[i], keys[i], nextBlocks[i])
		default:
			s.write(shards[i], hashes[i], keys[i], next[i], p.Params.ExpiresAt(next[i]), now)
		}
	}
	for _, j := range order {
		s.shards[j].mu.Unlock()
	}
	copy(results, res)
}

// Reset implements store.Store.
func (s *Store) Reset(_ context.Context, key string) error {
	if err := store.CheckKey(key); err != nil {
		return err
	}
	key = held(key)
	sh, h := s.locate(key)
	sh.mu.Lock()
	if i, ok := sh.find(h, key); ok {
		sh.remove(i)
	}
	sh.dropLeases(key)
	delete(sh.windows, key)
	delete(sh.blocks, key)
	sh.mu.Unlock()
	return nil
}

// A key holds one state at a time, of the shape of the limit that last
// wrote it (docs/semantics.md, "When a limit changes"): a bucket (token
// buckets, fixed and calendar windows, with the key's blocks of leased
// tokens), a sliding window's counts, or a lease set. The three are held
// apart (the table, windows, leases), so a write that makes a key's state
// of one shape drops the key's state of the others: a decision then
// finds its own shape's state or none, and none is a fresh key. Only the
// write that makes a state pays for this, never one that updates it.
const (
	shapeBucket = iota
	shapeSliding
	shapeLeases
)

// dropOthers drops the held key's states of every shape but keep. The
// caller holds sh.mu, the key's shard's lock.
func (s *Store) dropOthers(sh *shard, key string, keep int) {
	if keep != shapeBucket {
		if sh.n > 0 {
			_, h := s.locate(key)
			if i, ok := sh.find(h, key); ok {
				sh.remove(i)
			}
		}
		if len(sh.blocks) > 0 {
			delete(sh.blocks, key)
		}
	}
	if keep != shapeSliding && len(sh.windows) > 0 {
		delete(sh.windows, key)
	}
	if keep != shapeLeases && sh.leases != nil {
		sh.dropLeases(key)
	}
}
