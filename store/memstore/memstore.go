// Package memstore is drip's embedded store: bucket state in process
// memory, for one process. It is the default of drip serve and drip replay.
//
// Keys are spread over shards, each with its own lock, so that decisions on
// different keys rarely contend. Idle buckets are dropped once they would be
// full again, and the number of buckets is bounded (MaxKeys): when a shard is
// full, a sample of its buckets is examined and the one that is full, or
// nearest to full, is evicted, so an attacker sending endless new keys
// costs bounded memory and evicts the buckets that carry the least
// information. An evicted bucket that was not full comes back full: the
// bound trades that much over-admission for bounded memory.
package memstore

import (
	"context"
	"hash/maphash"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/driplimit/drip"
)

// DefaultMaxKeys is the default bound on the number of buckets: about
// 100 MB of state with short keys.
const DefaultMaxKeys = 1 << 20

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
	last       atomic.Pointer[cached]
	perShard   int
	shards     [shardCount]shard
	stop       chan struct{}
	stopOnce   sync.Once
	sweepEvery time.Duration
}

type shard struct {
	mu sync.Mutex
	m  map[string]*entry
	_  [40]byte // keep shards on separate cache lines
}

// cached is the last limit the store resolved, so that the common case (one
// limit, many keys) skips validation.
type cached struct {
	limit  drip.Limit
	params drip.Params
}

// entry is a bucket and the time it is full again (its expiry).
type entry struct {
	b   drip.Bucket
	exp int64
}

var _ drip.Store = (*Store)(nil)

// Option configures a Store.
type Option func(*Store)

// WithMaxKeys bounds the number of buckets held (default DefaultMaxKeys).
func WithMaxKeys(n int) Option {
	return func(s *Store) { s.perShard = max(1, (n+shardCount-1)/shardCount) }
}

// WithClock sets the clock used when a decision is made without a time.
// By default the store reads the wall clock once, at New, and counts from
// there on the monotonic clock: decisions never see the wall clock step
// back or jump, and reading it costs one call instead of two.
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
	s.sweepEvery = time.Minute
	for _, o := range opts {
		o(s)
	}
	for i := range s.shards {
		s.shards[i].m = make(map[string]*entry)
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

// SweepMargin is how long after a bucket expires (drip.Params.ExpiresAt)
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
		for k, e := range sh.m {
			if e.exp <= n {
				delete(sh.m, k)
				dropped++
			}
		}
		sh.mu.Unlock()
	}
	return dropped
}

// Len is the number of buckets held.
func (s *Store) Len() int {
	n := 0
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		n += len(sh.m)
		sh.mu.Unlock()
	}
	return n
}

func (s *Store) shardOf(key string) *shard {
	return &s.shards[maphash.String(s.seed, key)%shardCount]
}

func (s *Store) nanos(at time.Time) int64 {
	if at.IsZero() {
		return s.clock()
	}
	return at.UnixNano()
}

func (s *Store) clock() int64 {
	if s.now != nil {
		return s.now().UnixNano()
	}
	return s.start.UnixNano() + int64(time.Since(s.start))
}

// params is drip.Prepare with the last key-independent limit cached, by
// pointer so that the hot path copies no request: the params and the cost
// in fixed point.
func (s *Store) params(op drip.Op, r *drip.Request) (drip.Params, int64, error) {
	if err := drip.CheckKey(r.Key); err != nil {
		return drip.Params{}, 0, err
	}
	var p drip.Params
	if c := s.last.Load(); c != nil && c.limit == r.Limit {
		p = c.params
	} else {
		var err error
		if p, err = drip.ParamsOf(r.Limit, r.Key); err != nil {
			return p, 0, err
		}
		if !r.Limit.KeyDependent() {
			s.last.Store(&cached{r.Limit, p})
		}
	}
	cost, err := drip.CostOf(op, r.Cost, r.Reserve, p)
	return p, cost, err
}

// Apply implements drip.Store.
func (s *Store) Apply(_ context.Context, op drip.Op, at time.Time, r drip.Request) (drip.Decision, error) {
	p, cost, err := s.params(op, &r)
	if err != nil {
		return drip.Decision{}, err
	}
	now := s.nanos(at)
	sh := s.shardOf(r.Key)
	sh.mu.Lock()
	e, found := sh.m[r.Key]
	var b drip.Bucket
	if found {
		b = e.b
	}
	d, next, write := drip.Eval(op, b, found, p, cost, r.Reserve, now)
	if write {
		if found {
			e.b, e.exp = next, p.ExpiresAt(next)
		} else {
			s.put(sh, r.Key, next, p, now)
		}
	}
	sh.mu.Unlock()
	return d, nil
}

// put stores b under key, evicting if the shard is at its bound. The
// caller holds sh.mu.
func (s *Store) put(sh *shard, key string, b drip.Bucket, p drip.Params, now int64) {
	exp := p.ExpiresAt(b)
	if e, ok := sh.m[key]; ok {
		e.b, e.exp = b, exp
		return
	}
	if len(sh.m) >= s.perShard {
		s.evict(sh, now)
	}
	sh.m[strings.Clone(key)] = &entry{b: b, exp: exp} // the clone does not pin the caller's memory
}

// evict drops one bucket: an expired one if the sample finds one, else the
// one nearest to full (earliest expiry) among a sample. Go's map iteration
// starts at a random place, which makes the sample random.
func (s *Store) evict(sh *shard, now int64) {
	var victim string
	best := int64(0)
	seen := 0
	for k, e := range sh.m {
		if seen == 0 || e.exp < best {
			victim, best = k, e.exp
		}
		seen++
		if best <= now || seen >= evictSample {
			break
		}
	}
	delete(sh.m, victim)
}

// ApplyMulti implements drip.Store. It locks the shards involved in a fixed
// order, so concurrent multi-takes never deadlock.
func (s *Store) ApplyMulti(_ context.Context, op drip.Op, at time.Time, rs []drip.Request) (drip.Multi, error) {
	ps, err := drip.PrepareMulti(op, rs)
	if err != nil {
		return drip.Multi{}, err
	}
	now := s.nanos(at)
	var locked [shardCount]bool
	for _, p := range ps {
		locked[maphash.String(s.seed, p.Key)%shardCount] = true
	}
	for i := range locked {
		if locked[i] {
			s.shards[i].mu.Lock()
		}
	}
	buckets := make([]drip.Bucket, len(ps))
	found := make([]bool, len(ps))
	for i, p := range ps {
		if e, ok := s.shardOf(p.Key).m[p.Key]; ok {
			buckets[i], found[i] = e.b, true
		}
	}
	m, next, write := drip.EvalMulti(op, ps, buckets, found, now)
	for i, p := range ps {
		if write[i] {
			s.put(s.shardOf(p.Key), p.Key, next[i], p.Params, now)
		}
	}
	for i := range locked {
		if locked[i] {
			s.shards[i].mu.Unlock()
		}
	}
	return m, nil
}

// Reset implements drip.Store.
func (s *Store) Reset(_ context.Context, key string) error {
	if err := drip.CheckKey(key); err != nil {
		return err
	}
	sh := s.shardOf(key)
	sh.mu.Lock()
	delete(sh.m, key)
	sh.mu.Unlock()
	return nil
}
