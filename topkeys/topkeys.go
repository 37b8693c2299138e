// Package topkeys tells who is being limited: for each rule (or Envoy
// limit), the keys with the most requests and the most denials over the
// last minute, five minutes and hour, and the keys nearest their limit,
// in fixed memory per rule whatever the number of keys.
//
// A Tracker is an engine.KeyObserver (engine.WithKeys). Each decision
// counts its key in a Space-Saving summary (Metwally, Agrawal and El
// Abbadi): a fixed set of counters, where a key not counted yet takes
// over the smallest counter and inherits its count as its error. So a
// count overstates the truth by at most its Error, and a key not listed
// was counted at most the summary's bound (Window.RequestsBound,
// Window.DenialsBound). The counters of an interval (Interval, 10 s) are
// split in shards by the key's hash, each behind its own lock; when an
// interval ends (Tick), its summary is merged into those of the minute
// and of five minutes, kept in rings, and a window is the merge of what
// covers it, on read.
//
// A Tracker never reads the clock on the decision path (but for a
// denial, with a denial log): Tick ends the current interval (Run calls
// it every Interval).
package topkeys

import (
	"context"
	"hash/maphash"
	"sync"
	"sync/atomic"
	"time"

	"github.com/driplimit/drip/engine"
	"github.com/driplimit/drip/rules"
)

const (
	// Interval is how long each interval of counters lasts.
	Interval = 10 * time.Second
	// Capacity is the most keys a merged summary keeps (and a window
	// lists): shards × perShard counters in each interval.
	Capacity = shards * perShard
	// NearLeft is the share of its limit under which a key counts as near
	// it: a key with more left is not listed as near its limit.
	NearLeft = 0.5
	// NearCapacity is the most keys listed as nearest their limit.
	NearCapacity = shards * nearPerShard
	// MaxRules is the most rules (and Envoy limits) a Tracker follows at
	// once; a rule beyond it is not followed (Dropped counts its
	// decisions) until one of those followed has been idle for an hour.
	MaxRules = 1024

	shards       = 8
	perShard     = 16
	nearPerShard = 4

	fineSlots   = 6  // intervals of the last minute
	minuteSlots = 4  // whole minutes before the current one, for five minutes
	fiveSlots   = 11 // whole five minutes before the current ones, for the hour
	idleTicks   = 360
)

// Tracker follows the keys of every rule. Construct it with New; it is
// safe for concurrent use.
type Tracker struct {
	seed  maphash.Seed
	now   func() time.Time
	rules atomic.Pointer[map[string]*ruleStats]
	mu    sync.Mutex // adding and dropping rules
	// Dropped counts decisions not followed because MaxRules rules were.
	Dropped atomic.Int64

	log *DenialLog // denials.go; nil: no denial log
}

// Option configures a Tracker.
type Option func(*Tracker)

// WithClock sets the clock that dates intervals (default time.Now). The
// decision path reads it only on a denial, for the denial log.
func WithClock(now func() time.Time) Option { return func(t *Tracker) { t.now = now } }

// New returns a Tracker.
func New(opts ...Option) *Tracker {
	t := &Tracker{seed: maphash.MakeSeed(), now: time.Now}
	for _, o := range opts {
		o(t)
	}
	m := map[string]*ruleStats{}
	t.rules.Store(&m)
	return t
}

var _ engine.KeyObserver = (*Tracker)(nil)

// ruleStats are one rule's summaries.
type ruleStats struct {
	name   string
	shadow atomic.Bool // the rule's mode, as last seen
	log    logState    // denials.go
	gone   atomic.Bool // forgotten: a Prefixed view must look again
	cur    atomic.Pointer[slot]

	mu      sync.Mutex // the rings
	fine    [fineSlots]*slot
	pos     int // fine[pos] is cur
	ticks   int64
	idle    int64 // intervals in a row without a decision
	minAcc  *pair // the closed intervals of the current minute
	fiveAcc *pair // the closed minutes of the current five
	minutes [minuteSlots]*pair
	mpos    int
	fives   [fiveSlots]*pair
	fpos    int
	retired [2]uint64 // requests and denials of intervals recycled
}

// pair is requests and denials merged over some intervals.
type pair struct{ req, den *sum }

// slot is one interval's counters.
type slot struct {
	start  time.Time
	tick   int64 // the interval's number, from the rule's first
	shards [shards]shard
}

type shard struct {
	mu   sync.Mutex
	req  counters
	den  counters
	near nearest
	_    [64]byte // apart from the next shard's lock
}

func (t *Tracker) newRule(name string) *ruleStats {
	r := &ruleStats{name: name}
	now := t.now()
	for i := range r.fine {
		r.fine[i] = &slot{}
	}
	r.fine[0].start = now
	r.cur.Store(r.fine[0])
	return r
}

// stats returns the rule's summaries, made on its first decision.
func (t *Tracker) stats(rule string) *ruleStats {
	if r, ok := (*t.rules.Load())[rule]; ok {
		return r
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	old := *t.rules.Load()
	if r, ok := old[rule]; ok {
		return r
	}
	if len(old) >= MaxRules {
		return nil
	}
	m := make(map[string]*ruleStats, len(old)+1)
	for k, v := range old {
		m[k] = v
	}
	r := t.newRule(rule)
	m[rule] = r
	t.rules.Store(&m)
	return r
}

// Key counts a decision on rule's key (engine.KeyObserver): a request,
// and a denial when event is one; with the bucket's decision, how near
// the key is to its limit.
func (t *Tracker) Key(rule string, mode rules.Mode, event engine.Event, it *engine.Item) {
	r := t.stats(rule)
	if r == nil {
		t.Dropped.Add(1)
		return
	}
	t.count(r, mode, event, it)
}

// count counts a decision on r.
func (t *Tracker) count(r *ruleStats, mode rules.Mode, event engine.Event, it *engine.Item) {
	denied := false
	switch event {
	case engine.Denied, engine.LocalDenied:
		denied = true
	case engine.Allowed, engine.NotTaken, engine.LocalAllowed, engine.ErrorAllowed, engine.ErrorDenied:
	default:
		return // no request decided on the key (a refund, an unlimited limit, a failure)
	}
	if sh := mode == rules.Shadow; r.shadow.Load() != sh {
		r.shadow.Store(sh)
	}
	h := maphash.String(t.seed, it.Key)
	sl := r.cur.Load()
	sh := &sl.shards[h%shards]
	sh.mu.Lock()
	sh.req.add(h, it.Key)
	if denied {
		sh.den.add(h, it.Key)
	}
	if it.Decided && it.Decision.Burst > 0 {
		if it.Decision.Tokens < it.Decision.Burst*NearLeft {
			sh.near.note(sl.tick, h, it.Key, it.Decision.Tokens, it.Decision.Burst)
		} else if sh.near.n > 0 {
			sh.near.drop(h, it.Key) // no longer near
		}
	}
	sh.mu.Unlock()
	if denied && t.log != nil {
		t.log.denied(t.now().UnixNano(), r, mode, it)
	}
}

// Run calls Tick every Interval until ctx ends, and after each Tick
// each of after (drip serve puts its summaries on the store's board).
func (t *Tracker) Run(ctx context.Context, after ...func(context.Context)) {
	tk := time.NewTicker(Interval)
	defer tk.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tk.C:
			t.Tick()
			for _, f := range after {
				f(ctx)
			}
		}
	}
}

// Tick ends the current interval of every rule: its counters join the
// minute's and the five minutes', and the oldest interval's counters are
// cleared for the next. A rule without a decision for an hour is
// forgotten.
func (t *Tracker) Tick() {
	now := t.now()
	var idle []string
	for name, r := range *t.rules.Load() {
		if r.tick(now) {
			idle = append(idle, name)
		}
	}
	if len(idle) == 0 {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	old := *t.rules.Load()
	m := make(map[string]*ruleStats, len(old))
	for k, v := range old {
		m[k] = v
	}
	for _, name := range idle {
		old[name].gone.Store(true)
		delete(m, name)
	}
	t.rules.Store(&m)
}

// tick ends r's current interval at now; it reports whether r has been
// idle for an hour.
func (r *ruleStats) tick(now time.Time) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	closed := r.fine[r.pos]
	r.pos = (r.pos + 1) % fineSlots
	next := r.fine[r.pos]
	req, den := next.clear()
	r.retired[0] += req
	r.retired[1] += den
	next.start, next.tick = now, closed.tick+1
	for i := range next.shards { // the keys near their limit in the last minute go on
		from, to := &closed.shards[i], &next.shards[i]
		from.mu.Lock()
		to.near.carry(&from.near, next.tick-fineSlots+1)
		from.mu.Unlock()
	}
	r.cur.Store(next)

	p := closed.pair()
	if p.req.total == 0 {
		r.idle++
	} else {
		r.idle = 0
	}
	r.minAcc = mergePair(r.minAcc, p)
	r.ticks++
	if r.ticks%fineSlots == 0 {
		r.minutes[r.mpos] = r.minAcc
		r.mpos = (r.mpos + 1) % minuteSlots
		r.fiveAcc = mergePair(r.fiveAcc, r.minAcc)
		r.minAcc = nil
		if r.ticks%(fineSlots*5) == 0 {
			r.fives[r.fpos] = r.fiveAcc
			r.fpos = (r.fpos + 1) % fiveSlots
			r.fiveAcc = nil
		}
	}
	return r.idle >= idleTicks
}

func mergePair(a, b *pair) *pair {
	if a == nil {
		return b
	}
	return &pair{merge(a.req, b.req), merge(a.den, b.den)}
}

// each calls f on each shard of s, under its lock.
func (s *slot) each(f func(*shard)) {
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		f(sh)
		sh.mu.Unlock()
	}
}

// clear empties s for a new interval, and returns the requests and
// denials it had counted.
func (s *slot) clear() (req, den uint64) {
	s.each(func(sh *shard) {
		req += sh.req.total
		den += sh.den.total
		sh.req.reset()
		sh.den.reset()
		sh.near.n = 0
	})
	return req, den
}

// pair is the slot's summaries, its shards' put together (they count
// apart keys: a key not listed is under the largest shard bound).
func (s *slot) pair() *pair {
	p := &pair{req: &sum{start: s.start}, den: &sum{start: s.start}}
	s.each(func(sh *shard) {
		p.req.entries = sh.req.snapshot(p.req.entries)
		p.den.entries = sh.den.snapshot(p.den.entries)
		p.req.total += sh.req.total
		p.den.total += sh.den.total
		p.req.bound = max(p.req.bound, sh.req.bound())
		p.den.bound = max(p.den.bound, sh.den.bound())
	})
	p.req.sort()
	p.den.sort()
	return p
}

// totals are the requests and denials s counted.
func (s *slot) totals() (req, den uint64) {
	s.each(func(sh *shard) {
		req += sh.req.total
		den += sh.den.total
	})
	return req, den
}
