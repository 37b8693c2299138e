// Package leased decides at memory speed on a shared store without ever
// exceeding its limits: leased tokens (docs/semantics.md, "Leased
// tokens"). A Store wraps the shared store.Store of one instance; for the
// limits it leases it takes a block of a bucket's tokens in one store
// call, grants from that block in process, and gives back what is left.
// Every token granted locally was taken from the shared bucket first, and
// while a block is out the shared bucket refills only up to its burst less
// the tokens out in blocks (bucket.EvalBlocks), so no window of any length
// T sees more than burst + rate*T grants, whatever the number of
// instances. The price is early denials: a request may be denied while
// other instances hold unused tokens in their blocks, at most those
// tokens.
//
// Since Store is a store.Store, the engine, a drip.Limiter and drip serve
// use it unchanged. The store under it must hold blocks (Caps.Blocks).
//
// Over a store that decides in the process (Caps.InProcess: the memory
// store) leasing saves no call and would cost its bookkeeping on every
// take, so a Store passes every call to it as it is, counting nothing,
// and is free: the decisions are the store's, exactly. LeaseInProcess
// leases there too (a test or a simulation of several instances sharing
// one memory store).
package leased

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"hash/maphash"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/driplimit/drip/bucket"
	"github.com/driplimit/drip/internal/spans"
	"github.com/driplimit/drip/store"
)

// Defaults of the options.
const (
	// DefaultShare is the largest block, as a share of the burst.
	DefaultShare = 1.0 / 8
	// DefaultHorizon is how far ahead of its demand an instance takes
	// blocks: a block holds about this long of the key's recent demand.
	DefaultHorizon = 100 * time.Millisecond
	// DefaultTTL is a block's life: the instance stops granting from a
	// block this long after it sent the block's take, and gives back
	// what is left a little before.
	DefaultTTL = time.Second
	// DefaultMaxKeys bounds the keys an instance keeps local state for;
	// beyond it, decisions on new keys go to the store.
	DefaultMaxKeys = 1 << 16
)

// ErrNoBlocks is the error of New for a store that holds no blocks.
var ErrNoBlocks = errors.New("leased: the store does not hold blocks of leased tokens")

// Observer is told of the blocks an instance takes and gives back, for
// metrics. Its methods must be quick and safe for concurrent use. Tokens
// are micro-tokens (bucket.Micro).
type Observer interface {
	// BlockFetched: a block of size was taken for key.
	BlockFetched(key string, size int64)
	// BlockReturned: a block was given back with unused of its tokens.
	BlockReturned(key string, unused int64)
	// BlockExpired: a block ran out its life with lost tokens unused (or
	// its return failed): they count as granted (stranded).
	BlockExpired(key string, lost int64)
}

// Stats are an instance's counters since New.
type Stats struct {
	Decisions     int64 // takes decided, locally or by the store
	Local         int64 // takes granted from a block, without a store call
	StoreCalls    int64 // calls to the store, block takes and returns included
	Fetched       int64 // blocks taken
	Returned      int64 // blocks given back
	Expired       int64 // blocks that ran out their life, or whose return failed
	TokensLost    int64 // micro-tokens of expired blocks unused
	TokensHeld    int64 // micro-tokens unused in live blocks now
	FetchFailures int64 // block takes that failed (store errors)
}

// Option configures a Store.
type Option func(*Store)

// WithShare sets the largest block as a share of the burst (0 < f <= 1;
// default DefaultShare). A smaller share strands fewer tokens in an
// instance and costs more store calls on a hot key.
func WithShare(f float64) Option {
	return func(s *Store) {
		if f > 0 && f <= 1 {
			s.share = f
		}
	}
}

// WithHorizon sets how many of its recent demand an instance's blocks
// hold (default DefaultHorizon).
func WithHorizon(d time.Duration) Option {
	return func(s *Store) {
		if d > 0 {
			s.horizon = d
		}
	}
}

// WithTTL sets a block's life (default DefaultTTL; from 10 ms to
// bucket.MaxBlockTTL).
func WithTTL(d time.Duration) Option {
	return func(s *Store) {
		s.ttl = min(max(d, 10*time.Millisecond), time.Duration(bucket.MaxBlockTTL))
	}
}

// WithClock sets the instance's clock (default time.Now's), by which it
// measures demand and a block's life. A decision given its time uses that
// time instead.
func WithClock(now func() time.Time) Option { return func(s *Store) { s.now = now } }

// WithSelect sets which items are leased (default: every token bucket and
// fixed window item; a concurrency limit or a sliding window never is).
func WithSelect(f func(key string, p bucket.Params) bool) Option {
	return func(s *Store) { s.sel = f }
}

// Marked leases only the items of the limits marked leased
// (bucket.Prepared.Leased: a drip.Limit's Leased, a rules file's
// "leased": true, an Envoy rate_limit's leased: true), and passes every
// other call to the store as it is, counting nothing: the way to lease
// some limits of an instance, not all. Without it every token bucket
// and fixed window is leased (narrowed by WithSelect).
func Marked() Option { return func(s *Store) { s.marked = true } }

// WithObserver sets the observer of blocks.
func WithObserver(o Observer) Option { return func(s *Store) { s.obs = o } }

// WithMaxKeys bounds the keys the instance keeps local state for
// (default DefaultMaxKeys).
func WithMaxKeys(n int) Option { return func(s *Store) { s.maxKeys = max(1, n) } }

// LeaseInProcess leases over a store that decides in the process
// (Caps.InProcess) too, which a Store otherwise passes every call to as
// it is: for tests and simulations of several instances sharing one
// memory store in place of a remote one.
func LeaseInProcess() Option { return func(s *Store) { s.inproc = true } }

// Store is one instance's view of a shared store with leased tokens. It
// is safe for concurrent use. Call Close to give back its blocks.
type Store struct {
	st      store.Store
	share   float64
	horizon time.Duration
	ttl     time.Duration
	now     func() time.Time
	sel     func(string, bucket.Params) bool
	marked  bool // Marked: only the items marked Leased
	inproc  bool // LeaseInProcess
	through bool // every call passes to the store (an in-process one)
	obs     Observer
	maxKeys int

	heat   *[2 * heatSlots]heat // the demand of keys not yet hot
	seed   maphash.Seed
	prefix string         // this instance's block IDs begin with it
	seq    atomic.Uint64  // and end with a number
	keys   sync.Map       // key -> *local
	nkeys  atomic.Int64   // entries in keys
	wg     sync.WaitGroup // fetches and returns in flight
	stop   chan struct{}
	done   chan struct{}
	once   sync.Once

	decisions, local, calls, fetched, returned, expired, lost, failures atomic.Int64
	// plain counts the takes passed to the store as they are, each a
	// decision and a store call (Stats adds them to both): one counter
	// where two would each be a contended write a take.
	plain atomic.Int64

	// rtt is the time a block take takes, an average over the recent
	// ones (ns, on the instance's clock).
	rtt atomic.Int64
}

var _ store.Store = (*Store)(nil)

// New wraps st, which must hold blocks (Caps.Blocks), for one instance.
// It starts a goroutine that gives back the blocks of keys whose demand
// stopped; Close stops it.
func New(st store.Store, opts ...Option) (*Store, error) {
	if !st.Caps().Blocks {
		return nil, ErrNoBlocks
	}
	var id [9]byte
	_, _ = rand.Read(id[:])
	s := &Store{
		st: st, share: DefaultShare, horizon: DefaultHorizon, ttl: DefaultTTL,
		now: monotonic(), maxKeys: DefaultMaxKeys, obs: nopObserver{},
		heat: new([2 * heatSlots]heat), seed: maphash.MakeSeed(),
		prefix: base64.RawURLEncoding.EncodeToString(id[:]) + ".",
		stop:   make(chan struct{}), done: make(chan struct{}),
	}
	for _, o := range opts {
		o(s)
	}
	if s.through = st.Caps().InProcess && !s.inproc; s.through {
		close(s.done) // no blocks to give back: no janitor
		return s, nil
	}
	go s.janitor()
	return s, nil
}

// monotonic is the default clock: time.Now's, read from the monotonic
// clock alone (the wall time at New plus the time since), one clock read
// a decision instead of time.Now's two. The instance compares its own
// instants only, which time.Now compares by the monotonic clock anyway.
func monotonic() func() time.Time {
	start := time.Now()
	return func() time.Time { return start.Add(time.Since(start)) }
}

type nopObserver struct{}

func (nopObserver) BlockFetched(string, int64)  {}
func (nopObserver) BlockReturned(string, int64) {}
func (nopObserver) BlockExpired(string, int64)  {}

// Caps are the store's, its name too, without its fast path: takes
// go through the instance's blocks.
func (s *Store) Caps() store.Caps {
	c := s.st.Caps()
	c.Admit = nil
	return c
}

// Reset resets key in the store and forgets the instance's block of it
// (its tokens were taken; the reset gives the bucket back whole).
func (s *Store) Reset(ctx context.Context, key string) error {
	s.forget(key)
	return s.st.Reset(ctx, key)
}

// forget drops the instance's state of key and its blocks, which the
// store no longer holds: a reset dropped them, or a state of another
// shape replaced the key's bucket.
func (s *Store) forget(key string) {
	if v, ok := s.keys.LoadAndDelete(key); ok {
		s.nkeys.Add(-1)
		l := v.(*local)
		l.mu.Lock()
		l.cur, l.next = block{}, block{}
		l.out.Store(0)
		l.unprove()
		l.mu.Unlock()
	}
}

// replacing forgets the keys whose bucket the items replace: a take or
// refund of a sliding window or a concurrency limit, a state of another
// shape, replaces a bucket's state, blocks and all (docs/semantics.md,
// "When a limit changes"). The instance must not grant from those blocks
// after a rules reload changed the keys' algorithm.
func (s *Store) replacing(op bucket.Op, items []bucket.Prepared) {
	if op == bucket.Peek {
		return
	}
	for i := range items {
		// (A release changes nothing on a key that holds no leases.)
		if k := items[i].Params.Kind; k == bucket.Sliding || k == bucket.Concurrency && op == bucket.Take {
			if _, ok := s.keys.Load(items[i].Key); ok {
				s.forget(items[i].Key)
			}
		}
	}
}

// Stats returns the instance's counters.
func (s *Store) Stats() Stats {
	st := Stats{
		Decisions: s.decisions.Load() + s.plain.Load(), Local: s.local.Load(), StoreCalls: s.calls.Load() + s.plain.Load(),
		Fetched: s.fetched.Load(), Returned: s.returned.Load(), Expired: s.expired.Load(),
		TokensLost: s.lost.Load(), FetchFailures: s.failures.Load(),
	}
	s.keys.Range(func(_, v any) bool {
		l := v.(*local)
		l.mu.Lock()
		st.TokensHeld += l.cur.left + l.next.left
		l.mu.Unlock()
		return true
	})
	return st
}

// leased reports whether an item is decided from blocks.
func (s *Store) leased(it *bucket.Prepared) bool {
	if it.Reserve || it.Block != "" || it.Lease != "" {
		return false
	}
	return s.chosen(it)
}

// chosen reports whether an item's limit is leased: a token bucket or a
// fixed window, marked when Marked, and selected.
func (s *Store) chosen(it *bucket.Prepared) bool {
	if k := it.Params.Kind; k == bucket.Concurrency || k == bucket.Sliding || (s.marked && !it.Leased) {
		return false
	}
	return s.sel == nil || s.sel(it.Key, it.Params)
}

// passes reports whether a call goes to the store as it is under Marked:
// none of its items is marked.
func (s *Store) passes(items []bucket.Prepared) bool {
	if !s.marked {
		return false
	}
	for i := range items {
		if items[i].Leased {
			return false
		}
	}
	return true
}

// Apply decides a take of one leased item from the instance's block of
// its key when the block covers it, and else through the store: a block
// take when the key's demand calls for one (the take granted from it), or
// the item's own take. Peeks, refunds, calls of several items and items
// that are not leased go to the store as they are, and so does every call
// over an in-process store (without LeaseInProcess).
func (s *Store) Apply(ctx context.Context, op bucket.Op, at time.Time, items []bucket.Prepared, results []bucket.Result) error {
	if op == bucket.Refund && !s.through {
		s.refunded(items)
	}
	if s.through {
		return s.st.Apply(ctx, op, at, items, results)
	}
	s.replacing(op, items)
	if s.passes(items) {
		return s.st.Apply(ctx, op, at, items, results)
	}
	if op == bucket.Take && len(items) > 1 && s.allLeased(items) {
		s.decisions.Add(1)
		if s.takeLocal(at, items, results) {
			s.local.Add(1)
			spans.Leased(ctx, "local")
			return nil
		}
		now := s.clock(at)
		s.calls.Add(1)
		spans.Leased(ctx, "store")
		if err := s.st.Apply(ctx, op, at, items, results); err != nil {
			return err
		}
		// The items denied: their denials are repeated locally, as a
		// take of one item's are (for the keys that proved hot).
		for i := range items {
			if results[i].Allowed {
				continue
			}
			if l := s.held(&items[i]); l != nil {
				l.mu.Lock()
				l.denied, l.deniedCost, l.deniedAt = results[i], items[i].Cost, now
				l.mu.Unlock()
			}
		}
		return nil
	}
	if op != bucket.Take || len(items) != 1 || !s.leased(&items[0]) {
		if op == bucket.Take {
			s.plain.Add(1)
		} else {
			s.calls.Add(1)
		}
		return s.st.Apply(ctx, op, at, items, results)
	}
	return s.take(ctx, at, items[:1], results[:1])
}

// allLeased reports whether every item of a call is decided from blocks.
func (s *Store) allLeased(items []bucket.Prepared) bool {
	for i := range items {
		if !s.leased(&items[i]) {
			return false
		}
	}
	return true
}

// takeLocal decides a take of several items (distinct keys) from the
// instance's blocks when each item's key has a block that covers it: all
// of them are granted, under the locks of all their keys, taken in key
// order. Else it grants nothing, starts fetching blocks for the keys
// whose demand calls for one, and reports false: the call goes to the
// store, all or nothing there.
func (s *Store) takeLocal(at time.Time, items []bucket.Prepared, results []bucket.Result) bool {
	ls := make([]*local, len(items))
	order := make([]int, len(items))
	cold := false
	for i := range items {
		if ls[i] = s.hot(&items[i], at); ls[i] == nil {
			cold = true // the others' demand counted still
		}
		order[i] = i
	}
	if cold {
		return false
	}
	slices.SortFunc(order, func(a, b int) int { return strings.Compare(items[a].Key, items[b].Key) })
	for _, i := range order {
		ls[i].mu.Lock()
	}
	now := s.clock(at)
	all, denied := true, false
	for i, l := range ls {
		l.at = at
		l.add(now, items[i].Cost, s.horizon)
		all = all && l.covers(now, items[i].Cost)
		if _, ok := s.deniedNow(l, now, items[i].Cost); ok {
			denied = true
		}
	}
	if denied {
		// A store denial of one of the keys still holds: the call is
		// denied, each item reporting its own (the denial repeated, or
		// what the instance knows of its key).
		for i, l := range ls {
			r, ok := s.deniedNow(l, now, items[i].Cost)
			if !ok {
				r = localResult(&l.p, l.cur.left+l.next.left+max(0, l.avail))
				r.Allowed = l.covers(now, items[i].Cost)
			}
			results[i] = r
		}
		for _, i := range order {
			ls[i].mu.Unlock()
		}
		return true
	}
	var back []due
	for i, l := range ls {
		if all {
			results[i], _ = s.grant(l, now, items[i].Cost, at)
			continue
		}
		if l.cur.live(now) && l.cur.left > 0 && l.cur.left < items[i].Cost {
			back = append(back, due{l, l.cur, at}) // it would never cover: back to the store
			l.cur = block{}
		}
		if !l.fetching && l.next.id == "" && !l.covers(now, items[i].Cost) {
			if size := s.blockSize(l, items[i].Cost); size > 0 {
				s.fetchAhead(at, l, size)
			}
		}
	}
	for _, i := range order {
		ls[i].mu.Unlock()
	}
	if len(back) > 0 {
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			for _, d := range back {
				s.giveBack(context.Background(), d.at, d.l, d.b)
			}
		}()
	}
	return all
}

// covers reports whether grant would grant cost from l's blocks at now.
// The caller holds l.mu.
func (l *local) covers(now time.Time, cost int64) bool {
	if l.cur.live(now) {
		return l.cur.left >= cost
	}
	return l.next.live(now) && l.next.left >= cost
}

// due is a block to give back, with the time to give it at.
type due struct {
	l  *local
	b  block
	at time.Time
}

// A key proves hot before the instance keeps state for it: until then
// its takes go to the store as they are, the plain path (batched as any
// take), and cost here only a count of their demand. A key is hot once
// its demand in a window of the horizon (windows end where the
// instance's clock is a multiple of it) reaches hotTakes takes of its
// cost (80 a second at the default horizon): thinner demand would fill
// blocks of a few takes, each a store call that saves little, and keep
// state for every key of a workload spread over many. The demand of keys
// not yet hot is counted in a fixed table of meters, two per key picked
// by a hash of it (heatSlots in each of two rows; a key's demand is the
// lesser of its two), so it costs the same whatever the number of keys;
// keys that share a meter add up, so a cold key may look hotter than it
// is (in both rows at once: rarely), never colder. A meter is one word,
// its window and the micro-tokens taken in it, counted with a
// compare-and-swap: a take of a key not yet hot takes no lock, inserts
// nothing and allocates nothing (BenchmarkColdKeys).
const (
	heatSlots = 1 << 12
	hotTakes  = 8
	// heatBits is the width of a meter's count, heatMax the largest
	// count: the bits above hold the window's number, modulo 2^16 (a
	// meter left for 2^16 windows and taken in the same window number
	// again starts from its old count: a cold key may look hotter).
	heatBits = 48
	heatMax  = 1<<heatBits - 1
)

// heat is one meter of the demand of keys not yet hot: the micro-tokens
// taken in the current window (the low heatBits bits) and the window's
// number (the bits above).
type heat struct{ atomic.Uint64 }

// add counts cost in window w and returns the window's count so far.
func (h *heat) add(w, cost uint64) uint64 {
	tag := w << heatBits
	for {
		v := h.Load()
		n := cost
		if v&^heatMax == tag {
			n += v & heatMax
		}
		n = min(n, heatMax)
		if h.CompareAndSwap(v, tag|n) {
			return n
		}
	}
}

// meter is a recent demand, in micro-tokens per second: an average that
// forgets with a time constant of the horizon.
type meter struct {
	rate float64
	last time.Time // the last decision
}

// hot returns the instance's state of it's key and limit, counting this
// take's demand toward it while the key has not proved hot; nil while
// it has not, or when the instance keeps MaxKeys keys already. A take
// of more than heatMax/hotTakes micro-tokens (35 million tokens) never
// proves its key hot: the store decides it.
func (s *Store) hot(it *bucket.Prepared, at time.Time) *local {
	if l := s.held(it); l != nil {
		return l
	}
	cost := uint64(max(it.Cost, 1))
	if cost > heatMax/hotTakes {
		return nil
	}
	x := maphash.String(s.seed, it.Key)
	w := uint64(s.clock(at).UnixNano() / int64(s.horizon))
	least := min(s.heat[x%heatSlots].add(w, cost), s.heat[heatSlots+(x>>32)%heatSlots].add(w, cost))
	if least < hotTakes*cost {
		return nil
	}
	return s.localOf(it)
}

// refunded forgets the store's last denials of the items' keys: a
// refund gives tokens back, so they no longer prove a take denied.
func (s *Store) refunded(items []bucket.Prepared) {
	for i := range items {
		if v, ok := s.keys.Load(items[i].Key); ok {
			l := v.(*local)
			l.mu.Lock()
			l.deniedCost = 0
			l.unprove()
			l.mu.Unlock()
		}
	}
}

// held is the instance's state of it's key, if it keeps one for its
// limit.
func (s *Store) held(it *bucket.Prepared) *local {
	if v, ok := s.keys.Load(it.Key); ok {
		if l := v.(*local); l.p == it.Params {
			return l
		}
	}
	return nil
}

// local is an instance's state of one key: its block, the next one
// fetched ahead of need, and its recent demand.
type local struct {
	mu       sync.Mutex
	busy     chan struct{} // the one block call of take out now, closed at its end (nil: none)
	key      string
	p        bucket.Params
	cur      block
	next     block
	fetching bool
	meter              // the key's recent demand
	at       time.Time // the time the last decision was given (zero: the store's clock)
	// avail is the bucket's tokens after the store's last answer, and
	// starved whether a block take was denied since the last answer
	// that showed room.
	avail   int64
	known   bool
	starved bool
	// denied is the store's last denial of a take of deniedCost, sent
	// at deniedAt: until its RetryAfter has passed, takes of at least
	// that cost are denied without asking again.
	denied     bucket.Result
	deniedCost int64
	deniedAt   time.Time
	// probe is the newest probe of queued out now (nil: none); probed
	// the answered one sent last, a denial of which decides the callers
	// that came before it was sent.
	probe   *probe
	probed  *probe
	gen     uint64  // bumped by unprove
	probes  int     // probes out
	waiting int     // callers waiting for probes
	wide    float64 // how many may be out at once (widen; 0: 1)
	// out is the size of the blocks of this key the store may count as
	// outstanding for this instance: from the take's send to the
	// return's answer, or to the block's end.
	out atomic.Int64
}

// block is a block the instance holds (zero: none).
type block struct {
	id   string
	size int64
	left int64
	stop time.Time // no grant from it from then on: its send time + life
	ret  time.Time // give back what is left from then on
}

func (b *block) live(now time.Time) bool { return b.id != "" && now.Before(b.stop) }

func (s *Store) clock(at time.Time) time.Time {
	if !at.IsZero() {
		return at
	}
	return s.now()
}

func (s *Store) localOf(it *bucket.Prepared) *local {
	if v, ok := s.keys.Load(it.Key); ok {
		l := v.(*local)
		if l.p == it.Params {
			return l
		}
		// The limit changed: a new local state (the old one's block is
		// given back by the janitor... or simply dropped: it expires).
	}
	if s.nkeys.Load() >= int64(s.maxKeys) {
		return nil
	}
	l := &local{key: it.Key, p: it.Params}
	if v, loaded := s.keys.LoadOrStore(it.Key, l); loaded {
		old := v.(*local)
		if old.p == it.Params {
			return old
		}
		s.keys.Store(it.Key, l)
		return l
	}
	s.nkeys.Add(1)
	return l
}

// take decides the take of the one item. A key that has not proved hot
// (hot) goes to the store as it is, the plain path.
func (s *Store) take(ctx context.Context, at time.Time, items []bucket.Prepared, results []bucket.Result) error {
	it, res := &items[0], &results[0]
	l := s.hot(it, at)
	if l == nil {
		s.plain.Add(1)
		spans.Leased(ctx, "store")
		return s.st.Apply(ctx, bucket.Take, at, items, results)
	}
	s.decisions.Add(1)
	now := s.clock(at)
	l.mu.Lock()
	l.at = at
	l.add(now, it.Cost, s.horizon)
	if s.fromLocal(l, now, it.Cost, at, res) {
		spans.Leased(ctx, "local")
		return nil
	}
	// No block held and none worth fetching (the bucket nearly empty, or
	// the key's demand too thin): a take decided by the store, as without
	// leasing. While the store's last answer showed the bucket short of
	// the take, the takes of the key go through probes (queued); else as
	// many at once as the callers make.
	direct := l.cur.id == "" && l.next.id == "" && s.blockSize(l, it.Cost) <= it.Cost
	short := direct && l.known && l.avail < it.Cost
	l.mu.Unlock()
	if short {
		return s.queued(ctx, at, l, now, items, results)
	}
	if direct {
		return s.perDecision(ctx, at, l, now, items, results)
	}
	// One block call per key at a time from this instance, so that a hot
	// key's callers do not all ask the store at once for blocks. While
	// the store's last answer showed the bucket at least half full, the
	// callers that come while it is out wait for it, since it brings a
	// block that will cover them; but each waits only for that call,
	// never in turn behind the callers before it, and no longer than
	// about two block takes' time or half its deadline (waitFor): then
	// it takes as without leasing. Else they take as without leasing at once, each a take of
	// its own (batched by the store as any). Queued behind the call they
	// waited a round trip or more each (a return, a take, then a
	// per-decision take): on a saturated key whose store answers slowly
	// the key's decisions fell to about the limit's pace, and with a
	// block take that stalled every caller of the key waited out its
	// deadline (through drip serve, long enough for the engine's stall
	// timer to open its breaker).
	l.mu.Lock()
	busy := l.busy
	if busy == nil {
		l.busy = make(chan struct{})
	}
	wait := l.known && 2*l.avail >= l.p.Burst
	l.mu.Unlock()
	if busy != nil {
		if !wait {
			return s.perDecision(ctx, at, l, now, items, results)
		}
		t := time.NewTimer(s.waitFor(ctx))
		select {
		case <-busy:
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		}
		t.Stop()
		now = s.clock(at)
		l.mu.Lock()
		if s.fromLocal(l, now, it.Cost, at, res) {
			spans.Leased(ctx, "local")
			return nil
		}
		l.mu.Unlock()
		return s.perDecision(ctx, at, l, now, items, results)
	}
	done := false
	release := func() {
		if !done {
			done = true
			l.mu.Lock()
			close(l.busy)
			l.busy = nil
			l.mu.Unlock()
		}
	}
	defer release()
	now = s.clock(at)
	l.mu.Lock()
	if s.fromLocal(l, now, it.Cost, at, res) {
		spans.Leased(ctx, "local")
		return nil
	}
	// Nothing local covers it: what is left of the blocks goes back
	// first, so that the store sees every token this instance holds.
	var back []block
	for _, b := range []*block{&l.cur, &l.next} {
		if b.id != "" {
			if b.live(now) {
				back = append(back, *b)
			}
			*b = block{}
		}
	}
	size := s.blockSize(l, it.Cost)
	l.mu.Unlock()
	for _, b := range back {
		s.giveBack(ctx, at, l, b)
	}
	if size > it.Cost {
		b, r, ok, err := s.fetch(ctx, at, l, size, now)
		if err != nil {
			return err
		}
		if ok {
			b.left -= it.Cost
			var extra block
			l.mu.Lock()
			switch {
			case l.cur.id == "":
				l.cur = b
			case l.next.id == "":
				l.next = b
			default: // other decisions fetched meanwhile
				extra = b
			}
			l.mu.Unlock()
			if extra.id != "" {
				s.giveBack(ctx, at, l, extra)
			}
			r.Tokens += b.left
			r.RetryAfter = 0
			*res = r
			spans.Leased(ctx, "block")
			return nil
		}
	}
	release() // the block call is over: the callers waiting on it need not wait for this take too
	return s.perDecision(ctx, at, l, now, items, results)
}

// queued decides a take of l's key, which arrived at now, while the
// store's last answer showed its bucket short of the take: through
// probes, takes of the key sent one at a time (a few at once: widen),
// each while the probes out cannot decide the callers that come. A
// caller that comes while a probe is out waits for its answer, and a
// probe's denial (or a grant that left the bucket short: denialAfter)
// decides every caller that was waiting when it was sent, and those that
// came before its proof ended (denies): each is decided as the store
// decided the probe, at an instant between its arrival and its answer,
// so the denial is exact whenever the answer comes back. A caller the
// answers do not decide waits for the next probe, sent after it came, or
// sends it (as many out at once as widen allows), also after an answer
// that showed room for it; it takes on its own when it comes after such
// an answer, or once half its deadline has passed. While the answers
// show room (wide above pipeWide), a probe goes out every reach while
// callers wait, whether or not the one before has answered: a caller
// whose probe came back with room finds the next one out already, at
// most one token's time younger, instead of sending one then.
//
// Each taking on its own, the callers of a saturated key asked the store
// once a decision as long as its round trip was longer than the proof of
// its denials (one token's time: 5 ms at 200 a second): every answer came
// back with its proof over, none was repeated, the store's load grew and
// its round trips with it, and the key stayed there (PostgreSQL at 12-23
// ms a round trip, 98% of its denials over on arrival: runs of
// BenchmarkLeasedPostgres and BenchmarkLeasedPgBouncer made a store call
// a decision and ran at 0.59-0.9 of a plain instance). A probe's answer
// decides its waiters however long it took, so an instance sends about
// one take of the key a round trip.
//
// At an answer with room every caller waiting took on its own, a round
// trip more each: on a store whose round trip refills more tokens than
// the instances' probes take (PgBouncer at 20-60 ms: a quarter of the
// answers had room) 1,355 of 2,400 store calls in a run were those takes,
// and the fleet decided 0.76-1.56x what a plain one did, where a probe
// every round trip decided 10-35x (TestSaturatedKeyRoomyAnswers: 0.75-0.89
// of a plain fleet on a store of 20 ms round trips).
func (s *Store) queued(ctx context.Context, at time.Time, l *local, now time.Time, items []bucket.Prepared, results []bucket.Result) error {
	it, res := &items[0], &results[0]
	arrived := now
	var stop time.Time // when to stop waiting: half the deadline
	if dl, ok := ctx.Deadline(); ok {
		stop = time.Now().Add(time.Until(dl) / 2)
	}
	var timer, pipe *time.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
		if pipe != nil {
			pipe.Stop()
		}
	}()
	woke := false     // it waited, and nothing decided it
	var piping *probe // the probe after which it sends the next (pipe)
	l.mu.Lock()
	for {
		if p := l.probed; p != nil {
			if r, ok := p.denies(arrived, s.clock(at), it.Cost, s.horizon); ok {
				l.mu.Unlock()
				s.local.Add(1)
				*res = r
				spans.Leased(ctx, "local")
				return nil
			}
		}
		if !l.known || l.avail >= it.Cost && !woke || l.cur.id != "" || l.next.id != "" {
			// Room when it came, or blocks: as without the probes.
			l.mu.Unlock()
			return s.perDecision(ctx, at, l, s.clock(at), items, results)
		}
		p := l.probe
		reach := s.reach(l, it.Cost)
		if p == nil || l.probes < int(l.wide) || (p.sent.Before(arrived) || p == piping) && !s.clock(at).Before(p.sent.Add(reach)) {
			// None out that may decide it, fewer out than the answers
			// showed room for, or the newest out a reach old with
			// callers waiting on it (pipe): it sends the next.
			p = &probe{done: make(chan struct{}), sent: s.clock(at), cost: it.Cost, gen: l.gen}
			l.probe = p
			l.probes++
			l.mu.Unlock()
			err := s.perDecision(ctx, at, l, p.sent, items, results)
			l.mu.Lock()
			l.probes--
			if err == nil {
				p.res, p.ok = denialAfter(&l.p, it.Cost, *res)
				l.widen(it.Cost, *res, p.ok)
				if p.ok && p.gen == l.gen && (l.probed == nil || !p.sent.Before(l.probed.sent)) {
					l.probed = p
				}
			}
			if l.probe == p {
				l.probe = nil
			}
			l.mu.Unlock()
			close(p.done)
			return err
		}
		var next <-chan time.Time
		if !p.piped && l.wide > pipeWide {
			// The next probe goes out a reach after this one if this
			// one has not answered by then: it sends it.
			p.piped, piping = true, p
			d := max(0, p.sent.Add(reach).Sub(s.clock(at)))
			if pipe == nil {
				pipe = time.NewTimer(d)
			} else {
				pipe.Reset(d)
			}
			next = pipe.C
		}
		l.waiting++
		l.mu.Unlock()
		var timeout <-chan time.Time
		if !stop.IsZero() {
			if timer == nil {
				timer = time.NewTimer(max(0, time.Until(stop)))
			}
			timeout = timer.C
		}
		var err error
		select {
		case <-p.done:
		case <-next:
		case <-timeout:
		case <-ctx.Done():
			err = ctx.Err()
		}
		l.mu.Lock()
		l.waiting--
		woke = true
		switch {
		case err != nil:
			l.mu.Unlock()
			return err
		case timeout != nil && !stop.After(time.Now()):
			l.mu.Unlock()
			return s.perDecision(ctx, at, l, s.clock(at), items, results)
		}
	}
}

// probe is a take of a key sent by queued; done is closed once its answer
// is kept: res, when ok, is a denial of a take of cost at the instant the
// store decided it (denialAfter).
type probe struct {
	done chan struct{}
	sent time.Time
	cost int64
	res  bucket.Result
	ok   bool
	gen  uint64 // l.gen when sent
	// piped: a caller waiting on it sends the next probe a reach after
	// it, if it has not answered by then. Under l.mu.
	piped bool
}

// pipeWide is the width of the probes (local.wide) above which a probe
// goes out every reach while callers wait: an answer with room among the
// last five or so (widen).
const pipeWide = 1.5

// denies is p's denial brought forward to now for a take of cost that
// arrived at arrived and has waited since: it decides the take when the
// take was out when p was sent (the store then decided p after the take
// arrived and before now) or came before p's proof ended (its RetryAfter
// from p's send, at most the horizon, shortened as every proof is).
func (p *probe) denies(arrived, now time.Time, cost int64, horizon time.Duration) (bucket.Result, bool) {
	if !p.ok || cost < p.cost {
		return bucket.Result{}, false
	}
	if arrived.After(p.sent) && !arrived.Before(p.sent.Add(safe(min(p.res.RetryAfter, horizon)))) {
		return bucket.Result{}, false
	}
	r := p.res
	r.RetryAfter = max(0, r.RetryAfter-now.Sub(p.sent))
	return r, true
}

// denialAfter is the store's answer r to a take of cost as a denial of a
// take of cost at the instant the store decided it: r when it denied, and
// for a grant that left the bucket short of cost, the store's answer to a
// take of cost right after it (ok false when it left room, or for a
// calendar window, whose refills this does not compute). That answer
// holds the tokens left and the same reset, and waits until the refill
// reaches cost: the reset less the refill from cost to the burst (on a
// key whose blocks cap the bucket, that refill is shorter and the wait
// longer: the wait is never longer than the store's).
func denialAfter(p *bucket.Params, cost int64, r bucket.Result) (bucket.Result, bool) {
	if !r.Allowed {
		return r, true
	}
	if r.Tokens >= cost || p.Kind == bucket.Calendar {
		return bucket.Result{}, false
	}
	left := bucket.State{Tokens: r.Tokens}
	full, need := p.Until(left, p.Burst, 0), p.Until(left, cost, 0)
	if full >= math.MaxInt64/4 {
		return bucket.Result{}, false
	}
	retry := min(r.ResetAfter-(full-need), r.ResetAfter)
	if retry <= 0 {
		return bucket.Result{}, false
	}
	return bucket.Result{Tokens: r.Tokens, RetryAfter: retry, ResetAfter: r.ResetAfter}, true
}

// unprove drops what l's probes proved, and leaves unkept the answers
// of those out now: tokens were given back (a refund or a reset through
// the instance), which may cover the callers that come after. The
// caller holds l.mu.
func (l *local) unprove() {
	l.probed = nil
	l.gen++
}

// widen adjusts how many probes of l's key go out at once (wide, from
// 1 to 64) by a probe's answer r to a take of cost: a grant that left
// room for more (short false) widens them to one more than the takes it
// left room for, or than the callers waiting, since those wait for
// probes sent after them; a denial, or a grant that left the bucket
// short, narrows them by a twentieth (and above pipeWide a probe goes
// out every reach while callers wait: queued). On a store that decides the
// calls of each round trip at once, with the callers coming together
// after each answer, one probe per instance left the tokens of a round
// trip's refill unclaimed, granted with room, and the leased fleet
// decided half the takes of a plain one (TestSaturatedKeyAsPlain). The
// count follows the answers, not the store's round trip: as many probes
// as a round trip refills, on a store whose round trip grows with the
// calls out, made as many calls as a plain fleet, and the round trip that
// of a plain fleet (PgBouncer). The caller holds l.mu.
func (l *local) widen(cost int64, r bucket.Result, short bool) {
	if r.Allowed && !short {
		l.wide = min(64, max(l.wide, 1+float64(min(r.Tokens/max(cost, 1), int64(l.waiting)))))
		return
	}
	l.wide = max(1, l.wide*0.95)
}

// reach is how long a denial of a take of cost on l's key holds at most,
// whatever the bucket held (the time cost takes to refill from empty), at
// most the horizon: a caller that comes that long after a probe's send
// cannot be decided by its denial, and sends a probe of its own. The
// caller holds l.mu.
func (s *Store) reach(l *local, cost int64) time.Duration {
	if l.p.Kind == bucket.Calendar {
		return s.horizon
	}
	return min(s.horizon, l.p.Until(bucket.State{}, cost, 0))
}

// perDecision decides a take of l's key by the store, sent at now, and
// keeps what its answer says of the bucket: the tokens left, and a
// denial to repeat.
func (s *Store) perDecision(ctx context.Context, at time.Time, l *local, now time.Time, items []bucket.Prepared, results []bucket.Result) error {
	it, res := &items[0], &results[0]
	s.calls.Add(1)
	spans.Leased(ctx, "store")
	if err := s.st.Apply(ctx, bucket.Take, at, items, results); err != nil {
		return err
	}
	l.mu.Lock()
	l.avail, l.known = res.Tokens, true
	if res.Tokens >= 2*int64(s.share*float64(l.p.Burst)) {
		l.starved = false
	}
	if !res.Allowed {
		l.denied, l.deniedCost, l.deniedAt = *res, it.Cost, now
	} else {
		l.deniedCost = 0
	}
	l.mu.Unlock()
	return nil
}

// fromLocal decides a take of cost at now from what l holds: a grant
// from its blocks, or the store's last denial repeated. It reports
// whether it decided, and then has unlocked l.mu, which the caller holds.
func (s *Store) fromLocal(l *local, now time.Time, cost int64, at time.Time, res *bucket.Result) bool {
	if r, ok := s.grant(l, now, cost, at); ok {
		l.mu.Unlock()
		s.local.Add(1)
		*res = r
		return true
	}
	if r, ok := s.deniedNow(l, now, cost); ok {
		l.mu.Unlock()
		s.local.Add(1)
		*res = r
		return true
	}
	return false
}

// deniedNow is the store's last denial of l's key, repeated for a take
// of cost at now, while it holds. The caller holds l.mu.
func (s *Store) deniedNow(l *local, now time.Time, cost int64) (bucket.Result, bool) {
	if l.deniedCost > 0 && cost >= l.deniedCost && now.Before(l.deniedAt.Add(safe(min(l.denied.RetryAfter, s.horizon)))) && !now.Before(l.deniedAt) {
		r := l.denied
		r.RetryAfter -= now.Sub(l.deniedAt)
		return r, true
	}
	return bucket.Result{}, false
}

// add adds a decision of cost at now to the demand m. The caller holds
// the lock of m's owner.
func (m *meter) add(now time.Time, cost int64, horizon time.Duration) {
	// Decisions closer than a 64th of the horizon (a hot key's) decay
	// the average by 1 - x, x = dt/tau, instead of exp(-x): no
	// exponential under the key's lock, and never more than exp(-x) (the
	// relative error is below x*x/2, 1.2e-4).
	tau := horizon.Seconds()
	if !m.last.IsZero() {
		if dt := now.Sub(m.last); dt > 0 {
			x := dt.Seconds() / tau
			if dt < horizon/64 {
				m.rate *= 1 - x
			} else {
				m.rate *= math.Exp(-x)
			}
		}
	}
	m.rate += float64(cost) / tau
	if now.After(m.last) {
		m.last = now
	}
}

// grant grants cost from l's blocks at now, and fetches the next block
// when the current one runs low. The caller holds l.mu.
func (s *Store) grant(l *local, now time.Time, cost int64, at time.Time) (bucket.Result, bool) {
	if !l.cur.live(now) || l.cur.left < cost {
		if l.cur.id != "" && !l.cur.live(now) {
			s.expire(l, l.cur)
		} else if l.cur.id != "" && l.cur.left > 0 {
			return bucket.Result{}, false // too little left: the store decides, after the return
		}
		l.cur = block{}
		if l.next.live(now) && l.next.left >= cost {
			l.cur, l.next = l.next, block{}
		} else {
			return bucket.Result{}, false
		}
	}
	l.cur.left -= cost
	if l.cur.left == 0 {
		// Used up: the store learns it at once, so that its tokens
		// leave the cap now rather than at the block's expiry.
		done := l.cur
		l.cur, l.next = l.next, block{}
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			s.giveBack(context.Background(), at, l, done)
		}()
	}
	if !l.fetching && l.next.id == "" && (l.cur.left*2 < l.cur.size || !now.Before(l.cur.ret) || l.cur.id == "") {
		if size := s.blockSize(l, 0); size > 0 {
			s.fetchAhead(at, l, size)
		}
	}
	return localResult(&l.p, l.cur.left+l.next.left+max(0, l.avail)), true
}

// localResult is the result of a grant from a block: allowed, the tokens
// the instance knows of (its blocks', and the bucket's at the store's
// last answer), and the time they take to fill the burst.
func localResult(p *bucket.Params, tokens int64) bucket.Result {
	tokens = min(tokens, p.Burst)
	reset := time.Duration(float64(p.Burst-tokens) * float64(p.Period) / float64(p.Rate))
	return bucket.Result{Allowed: true, Tokens: tokens, ResetAfter: reset}
}

// waitFor is how long a caller waits for the block call of its key out
// now before it takes as without leasing: two block takes' usual time,
// at least a millisecond, and at most half of what is left of its
// deadline, so that a take of its own still has time.
func (s *Store) waitFor(ctx context.Context) time.Duration {
	d := max(2*time.Duration(s.rtt.Load()), time.Millisecond)
	if dl, ok := ctx.Deadline(); ok {
		d = min(d, time.Until(dl)/2)
	}
	return d
}

// span is how much of a key's demand a block holds: the horizon, or
// three block takes' time when the store is slower than that. A block
// fetched ahead when half used then comes before the current one runs
// out. (Holding only a horizon's demand, a block would run out first on
// a slow store, the callers would wait for the next, the demand they
// show would fall and the next block be smaller still.)
func (s *Store) span() time.Duration {
	return max(s.horizon, 3*time.Duration(s.rtt.Load()))
}

// blockSize is the size of the next block of l for a take of cost: its
// demand over the span, at most the share of the burst; 0 (no block:
// per-decision takes) when that would hold less than two takes of cost,
// or when the store's last answer showed fewer tokens than two such
// blocks. A key that saturated (its demand over the limit) thus takes
// plain takes, which the store batches, until it has tokens again:
// small blocks of what refilled between two answers would save few
// calls, and while a key holds blocks a store decides each take of it,
// every instance's, under their cap. The caller holds l.mu.
func (s *Store) blockSize(l *local, cost int64) int64 {
	if l.starved {
		return 0
	}
	want := int64(l.rate * s.span().Seconds())
	size := min(want, int64(s.share*float64(l.p.Burst)))
	if l.known && l.avail < 2*size {
		return 0
	}
	size = size / bucket.Micro * bucket.Micro // whole tokens
	if size < 2*max(cost, bucket.Micro) {
		return 0
	}
	return size
}

// fetchAhead starts fetching l's next block of size in the background
// (ahead). The fetch is the key's one block call out (busy) unless
// another is, so that a caller finding the blocks used up while it is
// out waits for it briefly or takes as without leasing, rather than
// sending a second block call behind it: with the fetch stalled, that
// call stalled too and its caller waited out its deadline. The caller
// holds l.mu.
func (s *Store) fetchAhead(at time.Time, l *local, size int64) {
	l.fetching = true
	own := l.busy == nil
	if own {
		l.busy = make(chan struct{})
	}
	s.wg.Add(1)
	go s.ahead(at, l, size, own)
}

// ahead fetches l's next block in the background, and ends l's block
// call out (busy) if it owns it.
func (s *Store) ahead(at time.Time, l *local, size int64, own bool) {
	defer s.wg.Done()
	ctx, cancel := context.WithTimeout(context.Background(), s.ttl)
	defer cancel()
	now := s.clock(at)
	b, _, ok, _ := s.fetch(ctx, at, l, size, now)
	l.mu.Lock()
	l.fetching = false
	if own {
		close(l.busy)
		l.busy = nil
	}
	if ok {
		if l.next.id == "" {
			l.next = b
			b = block{}
		}
	}
	l.mu.Unlock()
	if b.id != "" {
		s.giveBack(ctx, at, l, b)
	}
}

// fetch takes a block of size for l, sent at now.
func (s *Store) fetch(ctx context.Context, at time.Time, l *local, size int64, now time.Time) (block, bucket.Result, bool, error) {
	id := s.prefix + strconv.FormatUint(s.seq.Add(1), 36)
	it, err := store.PrepareBlock(bucket.Take, l.key, l.p, size, id, s.ttl)
	if err != nil {
		return block{}, bucket.Result{}, false, err
	}
	var rs [1]bucket.Result
	s.calls.Add(1)
	l.out.Add(size)
	err = s.st.Apply(ctx, bucket.Take, at, []bucket.Prepared{it}, rs[:])
	if d := int64(s.now().Sub(now)); d >= 0 {
		r := s.rtt.Load()
		if r == 0 {
			r = d // the first take
		}
		s.rtt.Store(r + (d-r)/4)
	}
	if err != nil {
		// The take may have been applied: its block stays counted until
		// it would end.
		s.failures.Add(1)
		s.later(l, size, now.Add(s.ttl))
		return block{}, bucket.Result{}, false, err
	}
	r := rs[0]
	l.mu.Lock()
	l.avail, l.known = r.Tokens, true
	l.starved = !r.Allowed
	l.mu.Unlock()
	if !r.Allowed {
		l.out.Add(-size)
		return block{}, r, false, nil
	}
	s.fetched.Add(1)
	s.obs.BlockFetched(l.key, size)
	life := safe(min(r.RetryAfter, s.ttl))
	return block{
		id: id, size: size, left: size,
		stop: now.Add(life),
		ret:  now.Add(life - life/4),
	}, r, true, nil
}

// safe is a span d the store measured from its answer, shortened for the
// instance to measure from its request's send: by the store clock's
// grain (a microsecond: Redis and PostgreSQL read theirs to it, and the
// memory store does too) and by a thousandth for the clocks' rates. The
// instance thus stops acting on the answer (granting from a block,
// denying as the store denied) before the store's own time for it has
// come, whatever the clocks read.
func safe(d time.Duration) time.Duration { return max(0, d-d/1000-time.Microsecond) }

// giveBack returns b's unused tokens to the store, within a block's life
// (past it the block has expired in the store, and its return changes
// nothing) and ctx's deadline: a stalled store holds neither the caller
// nor Close longer. ctx's cancellation does not stop it.
func (s *Store) giveBack(ctx context.Context, at time.Time, l *local, b block) {
	it, err := store.PrepareBlock(bucket.Refund, l.key, l.p, b.left, b.id, 0)
	if err != nil {
		return
	}
	var rs [1]bucket.Result
	s.calls.Add(1)
	life := s.ttl
	if dl, ok := ctx.Deadline(); ok {
		life = min(life, time.Until(dl))
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), life)
	defer cancel()
	if err := s.st.Apply(ctx, bucket.Refund, at, []bucket.Prepared{it}, rs[:]); err != nil {
		s.count(l, b)
		s.later(l, b.size, b.stop)
		return
	}
	l.out.Add(-b.size)
	s.returned.Add(1)
	s.obs.BlockReturned(l.key, b.left)
}

// expire counts b, whose life has ended, as expired with its unused
// tokens lost.
func (s *Store) expire(l *local, b block) {
	l.out.Add(-b.size)
	s.count(l, b)
}

func (s *Store) count(l *local, b block) {
	s.expired.Add(1)
	s.lost.Add(b.left)
	s.obs.BlockExpired(l.key, b.left)
}

// later stops counting size as outstanding for l at the instance's time
// end (a block whose take or return failed: the store may hold it till
// then).
func (s *Store) later(l *local, size int64, end time.Time) {
	d := end.Sub(s.now())
	if d <= 0 {
		l.out.Add(-size)
		return
	}
	time.AfterFunc(d, func() { l.out.Add(-size) })
}

// Outstanding is how many micro-tokens of key the store may count in
// this instance's blocks now (bucket.Outstanding over them): the sizes of
// its blocks from their take's send to their return's answer or their end.
// Tests use it to bound early denials.
func (s *Store) Outstanding(key string) int64 {
	if v, ok := s.keys.Load(key); ok {
		return v.(*local).out.Load()
	}
	return 0
}

// janitor gives back, every tenth of the TTL, the blocks near their
// expiry and those of keys whose demand stopped (no decision for twice
// the horizon), and forgets idle keys.
func (s *Store) janitor() {
	defer close(s.done)
	t := time.NewTicker(max(s.ttl/10, time.Millisecond))
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
			s.sweep(s.now(), false)
		}
	}
}

// sweep gives back the blocks due (all of them when closing) and forgets
// idle keys.
func (s *Store) sweep(now time.Time, closing bool) {
	var back []due
	s.keys.Range(func(k, v any) bool {
		l := v.(*local)
		l.mu.Lock()
		idle := now.Sub(l.last) > 2*s.horizon
		for _, b := range []*block{&l.cur, &l.next} {
			switch {
			case b.id == "":
			case !b.live(now):
				s.expire(l, *b)
				*b = block{}
			case closing || idle || !now.Before(b.ret):
				back = append(back, due{l, *b, l.at})
				*b = block{}
			}
		}
		if l.cur.id == "" && l.next.id == "" && !l.fetching && now.Sub(l.last) > 10*s.horizon {
			s.keys.Delete(k)
			s.nkeys.Add(-1)
		}
		l.mu.Unlock()
		return true
	})
	if len(back) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), s.ttl)
	defer cancel()
	for _, d := range back {
		s.giveBack(ctx, d.at, d.l, d.b)
	}
}

// Close stops the janitor and gives back every block held, waiting for
// fetches in flight. The store under it stays open.
func (s *Store) Close() error {
	s.once.Do(func() {
		close(s.stop)
		<-s.done
		s.wg.Wait()
		s.sweep(s.now(), true)
	})
	return nil
}
