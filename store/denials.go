package store

import (
	"context"
	"hash/maphash"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/driplimit/drip/bucket"
)

// Denials wraps a shared store so that a decision its last answer has
// already proven denied is denied in this process, without a store call.
//
// A take or peek of cost c that the store denied at t0 with RetryAfter r
// is a proof. By the math of docs/semantics.md, the bucket cannot hold c
// before t0+r: other decisions meanwhile only take. Until then the same
// request (key, limit, cost, reserve) is denied again from the proof.
//
// Only what gives tokens back could change the answer: a refund, a
// reset, an override, a returned block, a released lease. Those made
// through this wrapper clear the key's proof at once. Those made
// elsewhere are seen at the next store answer. A proof is trusted for at
// most Stale. A proof that would outlive Stale is renewed: from three
// quarters of Stale on, one call of the key goes to the store and renews
// it. Once a proof has ended, one call goes and the others wait for its
// answer.
//
// So do they after a grant that left the bucket short of the next take
// for at least DenialQueueAfter. On a hot key over its limit, the token
// that comes back goes to one call, and the denial of the call after it
// proves the others'; they do not all ask the store at once. A call
// waits behind two such calls at most, and behind the second only when
// the first came back within a quarter of Stale; then it asks itself.
//
// A call of several items is denied from the proofs when one item's
// proof holds and the store answered every other item within Stale.
// Calls with a lease or a block of leased tokens, and refunds, always go
// to the store.
//
// The proofs are bounded in bytes: a key's proof costs its length plus
// DenialEntryBytes. Past the bound, older proofs are dropped; their keys
// then cost a store call. Denied reports the local denials.
type Denials struct {
	st     Store
	stale  int64
	now    func() time.Time
	base   time.Time
	seed   maphash.Seed
	budget int64 // per shard
	denied atomic.Int64
	shards [denialShards]denialShard
}

const denialShards = 64

// DenialEntryBytes is what one key's proof is counted for beside its
// key's bytes: the entry and a share of its table's slack.
const DenialEntryBytes = 320

// Defaults of NewDenials.
const (
	// DefaultDenialBytes is the bound of the proofs an instance keeps
	// when none is given: about 25,000 keys of 16 bytes.
	DefaultDenialBytes = 8 << 20
	// DefaultDenialStale is how long a proof is trusted at most when no
	// bound is given: how late a refund or a reset made on another
	// instance may be seen.
	DefaultDenialStale = 100 * time.Millisecond
)

// maxWaits is how many flights of a key a call waits for at most.
const maxWaits = 2

// DenialQueueAfter is how long a grant must leave a key short of its next
// take for the key's next calls to queue behind one call to the store
// (see Denials) rather than all ask it: a key whose next token comes
// sooner is not queued, so that calls the store may allow are not held.
const DenialQueueAfter = time.Millisecond

type denialShard struct {
	mu    sync.Mutex
	m     map[string]denial
	bytes int64
	gen   uint64 // bumped by every refund and reset of one of its keys
}

// denial is the store's last answer for a key, as a proof (until > 0:
// a take of cost is denied before until) or as the answer of one item of
// a denied call of several (until 0).
type denial struct {
	p       bucket.Params
	cost    int64
	reserve bool
	byAt    bool  // the instants are a decision's at, not this process's clock
	t0      int64 // when the call was sent
	until   int64
	stop    int64 // trusted before it
	retryAt int64 // the instant the store's answer said a take may pass (until, or a nanosecond after)
	renew   int64 // from it, one call asks the store again (renewing), the others are denied on
	// flight is the one call of the key sent to the store to renew the
	// proof, or once it ended or grew stale: closed when its answer is
	// kept. The calls meanwhile are denied while the proof holds, else
	// wait for it (nil: none sent).
	flight chan struct{}
	ts     int64 // the bucket's TS as of t0, reconstructed (tsOK)
	tsOK   bool
	// queue: a grant left the bucket short of the next take (proving
	// nothing): the next call of the key leads a flight, the others wait.
	queue bool
	res   bucket.Result
}

// DenialsOptions configure NewDenials; the zero value is the defaults.
type DenialsOptions struct {
	// Bytes bounds the proofs kept (0: DefaultDenialBytes).
	Bytes int64
	// Stale is how long after the store's answer a proof is trusted at
	// most (0: DefaultDenialStale).
	Stale time.Duration
	// Clock is this process's clock, by which calls made at the store's
	// clock (a zero at) are timed (nil: time.Now, monotonic).
	Clock func() time.Time
}

// NewDenials wraps st. A store that decides in process (Caps.InProcess,
// the memory store) gains nothing from it: it denies as fast itself.
func NewDenials(st Store, o DenialsOptions) *Denials {
	if o.Bytes <= 0 {
		o.Bytes = DefaultDenialBytes
	}
	if o.Stale <= 0 {
		o.Stale = DefaultDenialStale
	}
	if o.Clock == nil {
		o.Clock = time.Now
	}
	d := &Denials{st: st, stale: int64(o.Stale), now: o.Clock, seed: maphash.MakeSeed(), budget: o.Bytes / denialShards}
	d.base = d.now()
	return d
}

// Unwrap is the store under it.
func (d *Denials) Unwrap() Store { return d.st }

// Caps are the store's.
func (d *Denials) Caps() Caps { return d.st.Caps() }

// Denied is how many decisions were denied from proofs, without a store
// call.
func (d *Denials) Denied() int64 { return d.denied.Load() }

// Bytes is what the proofs kept are counted for.
func (d *Denials) Bytes() int64 {
	var n int64
	for i := range d.shards {
		s := &d.shards[i]
		s.mu.Lock()
		n += s.bytes
		s.mu.Unlock()
	}
	return n
}

// Reset resets key in the store, and forgets its proof.
func (d *Denials) Reset(ctx context.Context, key string) error {
	d.forget(key)
	err := d.st.Reset(ctx, key)
	d.forget(key)
	return err
}

func (d *Denials) shard(key string) *denialShard {
	return &d.shards[maphash.String(d.seed, key)%denialShards]
}

func (d *Denials) forget(key string) {
	s := d.shard(key)
	s.mu.Lock()
	s.gen++
	if _, ok := s.m[key]; ok {
		delete(s.m, key)
		s.bytes -= int64(len(key)) + DenialEntryBytes
	}
	s.mu.Unlock()
}

// flight is, for a take of one item whose key's proof is due for
// renewal, has ended or grew stale, the channel this call closes once
// the store answered it (lead: the first such call), or the one to wait
// on before deciding again (wait: the calls while the first is out and
// the proof does not hold). On a hot key over its limit the callers then
// do not all ask the store: its answer proves the next denial, or lets
// them ask.
func (d *Denials) flight(t int64, byAt bool, items []bucket.Prepared) (lead, wait chan struct{}) {
	if len(items) != 1 || !provable(&items[0]) {
		return nil, nil
	}
	it := &items[0]
	s := d.shard(it.Key)
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.m[it.Key]
	if !ok || e.until == 0 && !e.queue || e.byAt != byAt || e.cost != it.Cost || e.reserve != it.Reserve || e.p != it.Params || t < e.t0 || t < e.renew {
		return nil, nil
	}
	if e.flight != nil {
		return nil, e.flight
	}
	e.flight = make(chan struct{})
	s.m[it.Key] = e
	return e.flight, nil
}

// landed closes ch, the flight of key's call that came back.
func (d *Denials) landed(key string, ch chan struct{}) {
	s := d.shard(key)
	s.mu.Lock()
	if e, ok := s.m[key]; ok && e.flight == ch {
		e.flight = nil
		s.m[key] = e
	}
	s.mu.Unlock()
	close(ch)
}

// instant is the time of a call in the proofs' timeline: at when the
// caller gives it, else this process's clock.
func (d *Denials) instant(at time.Time) (int64, bool) {
	if !at.IsZero() {
		return at.UnixNano(), true
	}
	return int64(d.now().Sub(d.base)), false
}

// provable reports whether an item's denial can be proven: a token
// bucket, a fixed, calendar or sliding window, without a lease or block.
func provable(it *bucket.Prepared) bool {
	return it.Params.Kind != bucket.Concurrency && it.Lease == "" && it.Block == ""
}

// Apply denies from the proofs what they prove denied, and passes the
// rest to the store, learning from its answers.
func (d *Denials) Apply(ctx context.Context, op bucket.Op, at time.Time, items []bucket.Prepared, results []bucket.Result) error {
	if op != bucket.Take && op != bucket.Peek {
		for i := range items {
			d.forget(items[i].Key)
		}
		err := d.st.Apply(ctx, op, at, items, results)
		for i := range items {
			d.forget(items[i].Key)
		}
		return err
	}
	t, byAt := d.instant(at)
	if d.local(t, byAt, items, results) {
		d.denied.Add(1)
		return nil
	}
	lead, wait := d.flight(t, byAt, items)
	var since time.Time
	if wait != nil {
		since = d.now()
	}
	for waited := 0; wait != nil; waited++ {
		select {
		case <-wait:
		case <-ctx.Done():
			return ctx.Err()
		}
		t, byAt = d.instant(at)
		if d.local(t, byAt, items, results) {
			d.denied.Add(1)
			return nil
		}
		if lead, wait = d.flight(t, byAt, items); waited+1 == maxWaits || d.now().Sub(since) > time.Duration(d.stale/4) {
			// A call waits for at most two (the grant of the token that
			// came back, the denial after it), and for the second only
			// when the first came back soon: behind more, or behind a
			// slow store, it asks the store itself, so that waiting adds
			// at most one answer and a quarter of Stale to its own.
			wait = nil
		}
	}
	if lead != nil {
		defer d.landed(items[0].Key, lead)
	}
	var buf [4]uint64
	gens := buf[:0]
	for i := range items {
		s := d.shard(items[i].Key)
		s.mu.Lock()
		gens = append(gens, s.gen)
		s.mu.Unlock()
	}
	if err := d.st.Apply(ctx, op, at, items, results); err != nil {
		return err
	}
	d.learn(op, t, byAt, gens, items, results)
	return nil
}

// Answer answers a take or a peek of items at at from the proofs, when
// they prove it denied. It writes results and reports whether it did. A
// caller that puts deadlines on store calls asks first, without one, and
// calls Apply when Answer did not. A proof due for renewal is left to
// Apply.
func (d *Denials) Answer(op bucket.Op, at time.Time, items []bucket.Prepared, results []bucket.Result) bool {
	if op != bucket.Take && op != bucket.Peek {
		return false
	}
	t, byAt := d.instant(at)
	if !d.local(t, byAt, items, results) {
		return false
	}
	d.denied.Add(1)
	return true
}

// local answers the call from the proofs, when they prove it denied.
func (d *Denials) local(t int64, byAt bool, items []bucket.Prepared, results []bucket.Result) bool {
	if len(items) == 1 {
		it := &items[0]
		if !provable(it) {
			return false
		}
		s := d.shard(it.Key)
		s.mu.Lock()
		e, ok := s.m[it.Key]
		if !ok || !e.proves(it, t, byAt) || e.renewing(t) {
			s.mu.Unlock()
			return false
		}
		s.mu.Unlock()
		results[0] = e.at(t)
		return true
	}
	proven := false
	for i := range items {
		it := &items[i]
		if !provable(it) {
			return false
		}
		s := d.shard(it.Key)
		s.mu.Lock()
		e, ok := s.m[it.Key]
		if !ok || !e.same(it, t, byAt) || e.until > 0 && t < e.until && e.renewing(t) {
			s.mu.Unlock()
			return false
		}
		s.mu.Unlock()
		if e.until > 0 {
			if t >= e.until {
				return false // it may pass now: only the store knows
			}
			proven = true
		}
		results[i] = e.at(t)
	}
	return proven
}

// renewing reports whether the call at t is to ask the store again for
// the proof e, which is near the end of the time it is trusted and has
// no call out (Apply then sends it, a flight): the other calls meanwhile
// are denied on, so that a hot key's callers do not all ask the store at
// once when its proof grows stale.
func (e *denial) renewing(t int64) bool {
	return t >= e.renew && e.flight == nil
}

// same reports whether e is an answer for it, current at t.
func (e *denial) same(it *bucket.Prepared, t int64, byAt bool) bool {
	return e.byAt == byAt && e.cost == it.Cost && e.reserve == it.Reserve && e.p == it.Params && t >= e.t0 && t < e.stop
}

// proves reports whether e proves a take of it denied at t.
func (e *denial) proves(it *bucket.Prepared, t int64, byAt bool) bool {
	return e.until > 0 && t < e.until && e.same(it, t, byAt)
}

// at is the store's answer of e brought forward to t: the waits counted
// down, the tokens refilled (for a token bucket whose state the answer
// tells; a window's stay until its end, a sliding window's are as the
// answer said).
func (e *denial) at(t int64) bucket.Result {
	r := e.res
	el := time.Duration(t - e.t0)
	if e.until > 0 {
		r.RetryAfter = time.Duration(e.retryAt - t)
	}
	r.ResetAfter = max(0, r.ResetAfter-el)
	if e.tsOK {
		r.Tokens = e.p.Refilled(bucket.State{Tokens: e.res.Tokens, TS: e.ts}, t).Tokens
	}
	return r
}

// learn keeps what the store's answer proves: a denial of one item, or
// the answers of every item of a denied call of several. An allowed item
// clears its key's proof. gens are the items' shards' generations when
// the call was sent: a refund or a reset since then leaves the answer
// unkept.
func (d *Denials) learn(op bucket.Op, t int64, byAt bool, gens []uint64, items []bucket.Prepared, results []bucket.Result) {
	denied := false
	for i := range results {
		denied = denied || !results[i].Allowed
	}
	for i := range items {
		it, r := &items[i], results[i]
		keep := provable(it) && denied && (!r.Allowed || len(items) > 1) || queue(op, it, r, len(items))
		s := d.shard(it.Key)
		s.mu.Lock()
		if s.gen != gens[i] {
			s.mu.Unlock()
			continue
		}
		old, had := s.m[it.Key]
		if had && old.t0 > t && old.byAt == byAt {
			// A later call's answer is kept already (an allowed one
			// sent before the denial it proved says nothing of it).
			s.mu.Unlock()
			continue
		}
		if !keep {
			if had {
				delete(s.m, it.Key)
				s.bytes -= int64(len(it.Key)) + DenialEntryBytes
			}
			s.mu.Unlock()
			continue
		}
		e := denial{p: it.Params, cost: it.Cost, reserve: it.Reserve, byAt: byAt, t0: t, stop: addSat(t, d.stale), renew: addSat(t, d.stale-d.stale/4), res: r}
		if r.Allowed && len(items) == 1 {
			e.queue, e.stop, e.renew = true, t, t // proves nothing
		}
		if !r.Allowed {
			e.until = addSat(t, int64(r.RetryAfter))
			e.retryAt = e.until
			if it.Params.Kind == bucket.Continuous {
				// The answer's wait lands on the nanosecond after the
				// instant the refill reaches the need, or on it: the
				// nanosecond before is proven.
				e.until--
			}
			if e.until <= t {
				e.until = 0
				e.stop = t // proves nothing
			} else if e.until <= e.stop {
				// It ends before it grows stale: nothing to renew; its
				// end is a flight's (one call asks, the others wait).
				e.renew = e.until
			}
			if k := it.Params.Kind; (k == bucket.Continuous || k == bucket.Interval) && r.RetryAfter < math.MaxInt64/4 {
				// The bucket's TS then: its refill reaches the need at
				// until, d after TS.
				need := it.Params.NeedFor(it.Cost, it.Reserve)
				if dd := it.Params.Until(bucket.State{Tokens: r.Tokens}, need, 0); dd < math.MaxInt64/4 {
					e.ts, e.tsOK = e.until-int64(dd), true
				}
			}
		}
		if !had {
			size := int64(len(it.Key)) + DenialEntryBytes
			if size > d.budget {
				s.mu.Unlock()
				continue
			}
			s.evict(size, d.budget, t)
			if s.m == nil {
				s.m = make(map[string]denial)
			}
			s.bytes += size
		}
		s.m[it.Key] = e
		s.mu.Unlock()
	}
}

// queue reports whether r, the answer to a take of the one item it, was
// a grant that left its bucket short of the next take of the same cost
// for at least DenialQueueAfter.
func queue(op bucket.Op, it *bucket.Prepared, r bucket.Result, n int) bool {
	if op != bucket.Take || n != 1 || !r.Allowed || !provable(it) {
		return false
	}
	need := it.Params.NeedFor(it.Cost, it.Reserve)
	if r.Tokens >= need {
		return false
	}
	switch it.Params.Kind {
	case bucket.Continuous, bucket.Interval:
		return it.Params.Until(bucket.State{Tokens: r.Tokens}, need, 0) >= DenialQueueAfter
	default: // a window's tokens come back at its end
		return r.ResetAfter >= DenialQueueAfter
	}
}

// evict drops proofs until size more bytes fit in budget: those no
// longer trusted first, among the few it looks at, then any. The caller
// holds s.mu.
func (s *denialShard) evict(size, budget, t int64) {
	if s.bytes+size <= budget {
		return
	}
	looked := 0
	for k, e := range s.m {
		if s.bytes+size <= budget {
			return
		}
		looked++
		if t >= e.stop || looked > 8 {
			delete(s.m, k)
			s.bytes -= int64(len(k)) + DenialEntryBytes
		}
	}
}

func addSat(a, b int64) int64 {
	if b > 0 && a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}
