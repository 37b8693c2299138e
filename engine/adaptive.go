package engine

import (
	"context"
	"math"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/driplimit/drip"
	"github.com/driplimit/drip/rules"
)

// This file is the adaptive rules (algorithm: adaptive): an in-flight
// limit learned in each instance from the latency and the failures of
// the requests it let through, decided in process (never in the store:
// the latency an instance sees is its own signal, and instances that
// added up their in-flight counts would each shrink for the others'
// load), with classes of priority and a queue ordered by them.
//
// The learning, per bucket (rule and key), over windows of completed
// requests (at least the rule's window and the latency of the last one,
// and a few requests, or ten windows; only requests let in since the
// limit last changed, whose latency tells of the limit as it is, and
// those let in before that were slower than the tolerance by more than
// the fewer in flight now explain: they tell of it too):
//
//   - baseline: the latency of the upstream unloaded, learned without
//     ever lowering the limit to measure it: a window faster than it
//     moves it down (quickly), one within the tolerance above it moves
//     it up (ten times slower) while the limit holds nothing back, so
//     it sits at a low quantile of healthy windows; the first window
//     lasts twice its first latency, so that it is not of the fastest
//     few;
//   - a window with drops (drop_status answers, requests that did not
//     complete) shrinks the limit by half their share (at most half);
//   - the limit grows only when it held requests back (one found no
//     room): by half each window from the start until the latency
//     rises past an eighth of the tolerance, then, while it stays
//     within that, by a slot, two, four... as
//     long as it goes on (at most half the limit): it creeps near the
//     knee where the latency begins to grow, and is back from far below
//     it within a few windows;
//   - a slower window moves the limit toward the capacity it measured
//     (the lesser of throughput times baseline and of the requests in
//     flight when they were let in times baseline/latency, plus half its
//     square root as a queue to keep the upstream busy): by smoothing of
//     the way within the tolerance, and past twice it (the upstream's
//     capacity fell) at once, halving at most. A throughput that fell
//     with in-flight requests still out shows there before their
//     latency does; a few requests past twice the tolerance end the
//     window at once (the capacity then from their load alone), since
//     every release until it ends would let in another as slow;
//   - a latency that does not fall from its highest while the limit
//     shrank by 30% over four windows or more was not caused by this
//     limit (the upstream got slower, or others load it): the baseline
//     is relearned at once and the limit restored to where the
//     shrinking began.

// ReasonOverloaded is the reason of a denial by an adaptive rule: its
// learned in-flight limit (for the request's class of priority) is
// reached. HTTP doors answer 503.
const ReasonOverloaded = "overloaded"

// ReasonShed is the reason of a denial for a low priority class: the
// rule kept the rest of its capacity for higher classes (reserve). HTTP
// doors answer 429.
const ReasonShed = "priority_shed"

// MaxAdaptiveKeys bounds the buckets of adaptive rules one engine
// learns. When they are all taken, the idle ones (no request in flight
// or waiting) are forgotten, at most once per adaptiveSweep; a new key
// that still finds no room shares its rule's overflow bucket.
const MaxAdaptiveKeys = 10000

// adaptiveSweep is how often a full set of adaptive buckets is swept of
// its idle ones: a sweep reads every bucket, so a set full of busy ones
// is not read again for each new key.
const adaptiveSweep = time.Second

// AdaptiveObserver is an Observer that is also told of the requests an
// adaptive rule or a rule with priorities shed (Shed: rule, the
// request's class, a number from 0 to 100 the client may choose: a
// metric labelled by it counts it in its band, rules.PriorityBand).
// Observers that do not implement it see the decisions only.
type AdaptiveObserver interface {
	Observer
	Shed(rule string, class int)
}

// AdaptiveState is what an adaptive rule has learned in this engine,
// added up over its buckets (Engine.Adaptive).
type AdaptiveState struct {
	Rule string `json:"rule"`
	// Limit is the learned limits added up (with one bucket, its limit),
	// InFlight the requests holding a slot, Queued those waiting.
	Limit    float64 `json:"limit"`
	InFlight int     `json:"in_flight"`
	Queued   int     `json:"queued"`
	// Buckets is how many keys the rule learns for.
	Buckets int `json:"buckets"`
	// Baseline is the longest baseline latency of its buckets.
	Baseline time.Duration `json:"baseline_ns"`
}

// adaptives are an engine's learned limits, by bucket key.
type adaptives struct {
	mu    sync.RWMutex
	m     map[string]*adaptive
	swept time.Time // the last sweep of idle buckets (forgetIdle)
	// queued counts the waiters of each rule (by name) in all its
	// buckets, which its max_queue bounds: a client that makes up keys
	// gets no queue of its own for each.
	queued map[string]*atomic.Int32
}

// adaptive is one bucket of an adaptive rule: its limit, its slots, its
// window of completed requests and its waiters.
type adaptive struct {
	rule string
	mu   sync.Mutex
	cfg  *rules.Adaptive // the rule's, as last loaded
	// pins counts the requests that found the bucket (adaptiveOf) and
	// have not yet left acquire: a pinned bucket is not forgotten.
	pins atomic.Int32

	limit    float64 // learned
	inflight int
	waiters  line          // by class, then arrival (a higher class never has a smaller share)
	queued   *atomic.Int32 // the waiters of the rule in all its buckets (adaptives.queued); nil: not counted
	plan     *Plan         // the RateLimit-Policy of the current cap
	planCap  int

	// the window
	start      time.Time
	n, drops   int
	ok         int
	sum        time.Duration // the latencies of the ok requests
	loads      int           // the requests in flight when each was let in
	peak       int           // most in flight
	short      bool          // a request found no room
	changed    time.Time     // when the limit last changed
	grown      bool          // the slow start is over
	run        int           // windows in a row that grew the limit
	lastRTT    time.Duration
	baseline   float64 // ns; 0 until learned
	streak     int     // windows in a row that shrank the limit on latency
	streakRTT  float64 // the highest latency of those windows
	streakFrom float64 // the limit when they began
}

// adaptiveOf is the bucket of an adaptive rule's key, made on first use,
// pinned: the caller unpins it when it has left acquire.
func (e *Engine) adaptiveOf(rule *rules.Rule, key string) *adaptive {
	as := &e.adapt
	as.mu.RLock()
	a, ok := as.m[key]
	if ok && a.rule == rule.Name {
		a.pins.Add(1)
	}
	as.mu.RUnlock()
	if ok && a.rule == rule.Name {
		a.reconfigure(rule.Adaptive)
		return a
	}
	as.mu.Lock()
	defer as.mu.Unlock()
	if a, ok := as.m[key]; ok && a.rule == rule.Name {
		a.pins.Add(1)
		return a
	}
	if as.m == nil {
		as.m = make(map[string]*adaptive)
	}
	if len(as.m) >= MaxAdaptiveKeys {
		as.forgetIdle(e.clock())
	}
	if len(as.m) >= MaxAdaptiveKeys {
		key = rule.Name + "\x00overflow"
		if a, ok := as.m[key]; ok {
			a.pins.Add(1)
			return a
		}
	}
	a = &adaptive{rule: rule.Name, cfg: rule.Adaptive, limit: float64(rule.Adaptive.InitialLimit)}
	if as.queued == nil {
		as.queued = make(map[string]*atomic.Int32)
	}
	if a.queued = as.queued[rule.Name]; a.queued == nil {
		a.queued = new(atomic.Int32)
		as.queued[rule.Name] = a.queued
	}
	a.pins.Add(1)
	as.m[key] = a
	return a
}

// adaptiveFound is the bucket of an adaptive rule's key when the engine
// has one (its rule's overflow bucket when the set is full), unpinned;
// nil when it has none.
func (e *Engine) adaptiveFound(rule *rules.Rule, key string) *adaptive {
	as := &e.adapt
	as.mu.RLock()
	a, ok := as.m[key]
	if !ok && len(as.m) >= MaxAdaptiveKeys {
		a, ok = as.m[rule.Name+"\x00overflow"]
	}
	as.mu.RUnlock()
	if !ok || a.rule != rule.Name {
		return nil
	}
	a.reconfigure(rule.Adaptive)
	return a
}

// forgetIdle deletes the buckets no request holds, waits for or is
// about to ask (pins), at most once per adaptiveSweep, so that keys a
// client made up once do not fill the set for good. A key forgotten
// learns again from initial_limit. The caller holds as.mu.
func (as *adaptives) forgetIdle(now time.Time) {
	if !as.swept.IsZero() && now.Sub(as.swept) < adaptiveSweep {
		return
	}
	as.swept = now
	for k, a := range as.m {
		a.mu.Lock()
		idle := a.inflight == 0 && len(a.waiters) == 0 && a.pins.Load() == 0
		a.mu.Unlock()
		if idle {
			delete(as.m, k)
		}
	}
}

// pruneAdaptive forgets the buckets of the rules that are no longer
// adaptive in set (a reload): their requests in flight release into
// buckets no longer found, which is harmless.
func (e *Engine) pruneAdaptive(set *rules.Set) {
	as := &e.adapt
	as.mu.Lock()
	defer as.mu.Unlock()
	for k, a := range as.m {
		r, ok := set.Rule(a.rule)
		if !ok || r.Adaptive == nil {
			delete(as.m, k)
		}
	}
}

// Adaptive reports what each adaptive rule has learned in this engine,
// by rule name.
func (e *Engine) Adaptive() []AdaptiveState {
	as := &e.adapt
	as.mu.Lock()
	all := make([]*adaptive, 0, len(as.m))
	for _, a := range as.m {
		all = append(all, a)
	}
	as.mu.Unlock()
	by := map[string]*AdaptiveState{}
	for _, a := range all {
		a.mu.Lock()
		s := by[a.rule]
		if s == nil {
			s = &AdaptiveState{Rule: a.rule}
			by[a.rule] = s
		}
		s.Limit += math.Floor(a.limit*1000) / 1000
		s.InFlight += a.inflight
		s.Queued += len(a.waiters)
		s.Buckets++
		s.Baseline = max(s.Baseline, time.Duration(a.baseline))
		a.mu.Unlock()
	}
	out := make([]AdaptiveState, 0, len(by))
	for _, s := range by {
		out = append(out, *s)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Rule < out[j].Rule })
	return out
}

func (a *adaptive) reconfigure(cfg *rules.Adaptive) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.cfg == cfg {
		return
	}
	a.cfg = cfg
	a.limit = min(max(a.limit, float64(cfg.MinLimit)), float64(cfg.MaxLimit))
	a.grant()
}

// capacity is the most requests in flight now: the learned limit,
// rounded down, within the rule's bounds.
func (a *adaptive) capacity() int {
	return min(max(int(a.limit), a.cfg.MinLimit), a.cfg.MaxLimit)
}

// room is the most requests in flight that a request of share s of the
// capacity may join: all of the capacity for share 1 (critical, or a
// rule without priorities), else the capacity less the slots kept for
// higher classes, rounded down (a small capacity keeps none).
func (a *adaptive) room(share float64) int {
	c := a.capacity()
	if share >= 1 {
		return c
	}
	return c - int(float64(c)*(1-share)+1e-9)
}

// admission is when a request took its slot and how many were in
// flight with it then: what the latency it sees tells of.
type admission struct {
	at   time.Time
	load int
}

// acquire takes a slot for a request of class (share of the capacity),
// waiting up to wait in the bucket's queue (of at most maxQueue) when
// there is none: ok reports a slot taken, at the admission returned;
// shed reports that the request's class was what kept it out (a higher
// class would have had one).
func (a *adaptive) acquire(ctx context.Context, now func() time.Time, class int, share float64, wait time.Duration, maxQueue int) (adm admission, ok, shed bool) {
	a.mu.Lock()
	room := a.room(share)
	if a.inflight < room && !a.higherWaiting(class) {
		a.take(now())
		adm = admission{now(), a.inflight}
		a.mu.Unlock()
		return adm, true, false
	}
	a.short = true
	shed = share < 1 && a.inflight < a.capacity()
	w := &waiter{class: class, share: share, since: time.Now(), until: time.Now().Add(wait), ch: make(chan bool, 1)}
	if wait <= 0 || !a.enqueue(w, maxQueue) {
		a.mu.Unlock()
		return admission{}, false, shed
	}
	a.mu.Unlock()
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case got := <-w.ch:
		return admission{now(), w.load}, got, !got || shed
	case <-t.C:
	case <-ctx.Done():
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.unqueue(w) {
		return admission{}, false, shed
	}
	got := <-w.ch // granted or shed as it left: a grant is kept
	return admission{now(), w.load}, got, !got || shed
}

// take counts a request in flight.
func (a *adaptive) take(now time.Time) {
	a.inflight++
	if onTake != nil {
		onTake(a.inflight, a.capacity())
	}
	if a.start.IsZero() {
		a.start = now
	}
	a.peak = max(a.peak, a.inflight)
}

// higherWaiting reports whether a request of class at least class waits.
func (a *adaptive) higherWaiting(class int) bool {
	return len(a.waiters) > 0 && a.waiters[0].class >= class
}

// enqueue adds w to the bucket's queue (queue.go's line, as the rate
// and concurrency rules' queues). A queue is full when it holds
// maxQueue waiters, or the rule does in all its buckets: a full queue
// sheds its lowest waiter for a higher class, else refuses.
func (a *adaptive) enqueue(w *waiter, maxQueue int) bool {
	maxQueue = max(maxQueue, 1)
	if len(a.waiters) >= maxQueue || !a.count(maxQueue) {
		last := a.waiters.dropFor(w, time.Now())
		if last == nil {
			return false
		}
		a.waiters.remove(last) // its place in the count goes to w
		last.ch <- false
	}
	a.waiters.insert(w)
	return true
}

// count counts one more waiter of the rule, unless it has maxQueue.
func (a *adaptive) count(maxQueue int) bool {
	if a.queued == nil {
		return true
	}
	for {
		n := a.queued.Load()
		if int(n) >= maxQueue {
			return false
		}
		if a.queued.CompareAndSwap(n, n+1) {
			return true
		}
	}
}

// unqueue takes w out of the bucket's queue, and reports whether it was
// there.
func (a *adaptive) unqueue(w *waiter) bool {
	if !a.waiters.remove(w) {
		return false
	}
	if a.queued != nil {
		a.queued.Add(-1)
	}
	return true
}

// grant hands free slots to the waiters, highest class first (first in
// first out, or last in first out when overloaded: line.next), while
// their class has room.
func (a *adaptive) grant() {
	for len(a.waiters) > 0 {
		w := a.waiters.next(time.Now())
		if a.inflight >= a.room(w.share) {
			return
		}
		a.unqueue(w)
		a.inflight++
		if onTake != nil {
			onTake(a.inflight, a.capacity())
		}
		a.peak = max(a.peak, a.inflight)
		w.load = a.inflight
		w.ch <- true
	}
}

// release gives back a slot taken at adm: the request took until now
// and dropped (an overloaded answer, or none) or not.
func (a *adaptive) release(adm admission, now time.Time, dropped, learn bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.inflight--
	if learn {
		a.sample(now.Sub(adm.at), now, adm.load, dropped)
	}
	a.grant()
}

// minSamples is how many completed requests a window holds at least,
// unless it lasts ten windows.
const minSamples = 5

var debugAdaptive = false

// onTake, set by tests only, sees each slot taken: the requests in
// flight then, and the capacity they are held to.
var onTake func(inflight, capacity int)

// sample counts a completed request in the window, and ends the window
// when it is long enough: it took rtt, let in with load in flight.
func (a *adaptive) sample(rtt time.Duration, now time.Time, load int, dropped bool) {
	if now.Add(-rtt).Before(a.changed) && !a.tells(rtt, load) {
		// Let in before the limit last changed: it tells of the old
		// one. The window begins after the last of them.
		a.start = now
		return
	}
	a.n++
	if dropped {
		a.drops++
	} else {
		a.ok++
		a.sum += max(rtt, 0)
		a.loads += load
	}
	if a.lastRTT == 0 {
		// The first window lasts twice the latency of its first request
		// at least: else it would end with the fastest few, and the
		// baseline be learned from them.
		a.lastRTT = 2 * max(rtt, 0)
	}
	elapsed := now.Sub(a.start)
	long := max(a.cfg.Window, a.lastRTT)
	if (elapsed < long || (a.n < minSamples && elapsed < 10*long)) && !a.far() {
		return
	}
	l := a.limit
	a.update(elapsed)
	if a.limit != l {
		a.changed = now
	}
	a.start, a.n, a.drops, a.ok, a.sum, a.loads, a.peak, a.short = now, 0, 0, 0, 0, 0, a.inflight, len(a.waiters) > 0
}

// far reports whether the window holds enough requests, and slow
// enough, to end it at once: a few, on average past twice the
// tolerance (the upstream's capacity fell). Each request let in until
// the window would have ended is let in under the limit it shows too
// high, and is as slow.
func (a *adaptive) far() bool {
	return a.grown && a.ok >= minSamples && a.baseline > 0 &&
		float64(a.sum)/float64(a.ok) > a.baseline*(1+2*a.cfg.Tolerance)
}

// tells reports whether a request let in before the limit last
// changed, with load in flight, that took rtt tells of the limit as it
// is: it was slower than the tolerance by more than the load the limit
// now lets in fewer than then explains (as when the upstream's capacity
// fell while it was in flight). Its window then counts it: else the
// limit would go on letting in as many, each as slow, until a window of
// requests let in since ended.
func (a *adaptive) tells(rtt time.Duration, load int) bool {
	if a.baseline == 0 || load <= 0 || a.limit <= 0 {
		return false
	}
	return float64(rtt) > a.baseline*(1+a.cfg.Tolerance)*max(1, float64(load)/a.limit)
}

// update learns from the window just ended (elapsed long).
func (a *adaptive) update(elapsed time.Duration) {
	if debugAdaptive {
		defer func(l float64) {
			println("win", elapsed/time.Millisecond, "n", a.n, "drops", a.drops, "rtt", int(float64(a.sum)/float64(max(a.ok, 1))/1e6), "base", int(a.baseline/1e6), "peak", a.peak, "load", a.loads/max(a.ok, 1), "L", int(l), "->", int(a.limit), "streak", a.streak)
		}(a.limit)
	}
	lo, hi := float64(a.cfg.MinLimit), float64(a.cfg.MaxLimit)
	l := a.limit
	early := elapsed < max(a.cfg.Window, a.lastRTT) // ended early (far)
	used := float64(a.peak) >= l/2
	full := a.short
	if a.drops > 0 {
		share := float64(a.drops) / float64(a.n)
		a.limit = max(lo, l*(1-min(share, 1)/2))
		a.streak, a.run = 0, 0
		return
	}
	if a.ok == 0 {
		return
	}
	rtt := float64(a.sum) / float64(a.ok)
	a.lastRTT = time.Duration(rtt)
	if a.baseline == 0 {
		a.baseline = rtt
	}
	weight := float64(a.ok) / float64(a.ok+minSamples)
	tol := a.cfg.Tolerance
	switch {
	case rtt <= a.baseline:
		a.baseline += (rtt - a.baseline) * 0.2 * weight
	case rtt <= a.baseline*(1+tol) && !used:
		// Up only while the limit is not what holds the requests: a
		// limit in use would drift up with the latency it causes.
		a.baseline += (rtt - a.baseline) * 0.02 * weight
	}
	if !a.grown && rtt <= a.baseline*(1+tol/8) {
		// Slow start: half again a window until the latency grows.
		if full {
			a.limit = min(hi, l*1.5)
		}
		return
	}
	a.grown = true
	if rtt <= a.baseline*(1+tol/8) {
		a.streak = 0
		if !full {
			a.run = 0
			return
		}
		// The limit held requests back and the upstream is hardly
		// slower: there is room. A slot, then twice as many each
		// window it goes on (half the limit at most): near the knee
		// the limit creeps, far below it it is back within a few
		// windows.
		a.limit = min(hi, l+min(max(1, l/2), math.Ldexp(1, min(a.run, 30))))
		a.run++
		return
	}
	a.run = 0
	// Slower: the upstream begins to queue.
	if !used {
		return // the limit is not what holds the requests: nothing to shrink for
	}
	capacity := float64(a.ok+a.drops) / float64(elapsed) * a.baseline
	if a.loads > 0 {
		// The requests were let in with loads/ok in flight on average
		// and took rtt: at the baseline the upstream serves as many as
		// that times baseline/rtt at once. Throughput shows a capacity
		// that fell only as the requests let in before complete, and
		// over a window ended early it tells nothing.
		byLoad := float64(a.loads) / float64(a.ok) * a.baseline / rtt
		if early {
			capacity = byLoad
		} else {
			capacity = min(capacity, byLoad)
		}
	}
	target := capacity + math.Sqrt(capacity)/2
	if rtt <= a.baseline*(1+tol) {
		// Within the tolerance: toward the capacity measured, by
		// smoothing, near the knee where the latency grows.
		a.streak = 0
		if target < l {
			a.limit = max(lo, l+(target-l)*a.cfg.Smoothing)
		}
		return
	}
	if a.streak == 0 {
		a.streakRTT, a.streakFrom = 0, l
	}
	a.streak++
	a.streakRTT = max(a.streakRTT, rtt)
	if a.streak > 3 && l <= 0.7*a.streakFrom && rtt >= 0.95*a.streakRTT {
		// The limit shrank and the latency did not follow: not this
		// limit's doing. Relearn the baseline, restore the limit.
		a.baseline, a.limit, a.streak = rtt, max(l, a.streakFrom), 0
		return
	}
	switch {
	case target >= l:
	case rtt > a.baseline*(1+2*tol):
		// Far past the knee (the upstream's capacity fell): to the
		// capacity measured at once, halving at most.
		a.limit = max(lo, l/2, target)
	default:
		a.limit = max(lo, l+(target-l)*a.cfg.Smoothing)
	}
}

// classOf is the request's class of priority under rule: the one its
// priority_from names (one it cannot read: PriorityDefault), else the
// rule's.
func classOf(r Values, rule *rules.Rule) int {
	if rule.PriorityFrom != nil {
		if s, ok := r.Value(*rule.PriorityFrom); ok {
			p, _ := rules.ParsePriority(s)
			return p
		}
	}
	return rule.Class()
}

// admit takes a slot of each adaptive rule of ad in turn, each waiting
// up to its max_wait for one; when one is refused, those taken are given
// back (learning nothing) and the one that denied is returned.
func (e *Engine) admit(ctx context.Context, ad []*Applied) (denied *Applied) {
	for i, a := range ad {
		b := e.adaptiveOf(a.Rule, a.Key)
		adm, ok, shed := b.acquire(ctx, e.clock, a.Class(), a.Rule.Share(a.Class()), a.Wait, a.MaxQueue)
		b.pins.Add(-1) // held (in flight) or no longer needed
		a.Decided = true
		a.Decision, a.Plan = b.state(ok)
		if !ok {
			for _, x := range ad[:i] {
				x.slot.release(x.since, x.since.at, false, false)
				x.slot, x.Event = nil, NotTaken
				x.Decision.Remaining++
			}
			for _, x := range ad[i+1:] {
				x.Event = NotTaken // not asked
			}
			a.Event, a.Reason, a.shed = Denied, ReasonOverloaded, shed
			return a
		}
		a.slot, a.since, a.Event = b, adm, Allowed
	}
	return nil
}

// unadmit gives back the slots of ad: another rule denied the request.
func unadmit(ad []*Applied) {
	for _, a := range ad {
		if a.slot != nil {
			a.slot.release(a.since, a.since.at, false, false)
			a.slot, a.Event = nil, NotTaken
			a.Decision.Remaining++
		}
	}
}

// state is the bucket as the headers tell of it: its capacity now and
// the free slots after the request (allowed or not), and the
// RateLimit-Policy of that capacity (made again only when it changes).
func (a *adaptive) state(allowed bool) (drip.Decision, *Plan) {
	a.mu.Lock()
	defer a.mu.Unlock()
	c := a.capacity()
	d := drip.Decision{Allowed: allowed, Burst: float64(c), Remaining: int64(max(0, c-a.inflight))}
	d.Tokens = float64(d.Remaining)
	if !allowed {
		d.RetryAfter = ConcurrencyRetryAfter
	}
	if a.plan == nil || a.planCap != c {
		a.plan, a.planCap = PlanOf(a.rule, drip.Limit{Algorithm: drip.Concurrency, MaxInFlight: c}), c
	}
	return d, a.plan
}

// releaseSlot gives back an adaptive rule's slot when the request ends,
// learning from it when learn: it took from since to now, and dropped or
// not.
func (a *Applied) releaseSlot(now time.Time, dropped, learn bool) {
	if a.slot != nil {
		a.slot.release(a.since, now, dropped, learn)
		a.slot = nil
	}
}

// shedPriority checks the prioritized rules a request was just allowed
// by: a request of a class below critical must leave its share of the
// rule's capacity (Rule.Share) free, else it is shed (what it took is
// given back by the caller). It returns the rule that shed it.
func shedPriority(enf []Applied) *Applied {
	for i := range enf {
		if a := &enf[i]; a.Rule.Adaptive == nil && sheds(&a.Item) {
			return a
		}
	}
	return nil
}

// blockedItem stands for an adaptive rule that denied the request among
// the items of the store's step: the others are then peeked.
var blockedItem = Item{blocked: true, Plan: PlanOf("", drip.Limit{})}

// shedBy records that rule a denied the request (for reason) and, when
// its class is what kept it out, that it was shed.
func (e *Engine) shedBy(out *Outcome, a *Applied, reason string) {
	a.Event, a.Reason = Denied, reason
	a.Decision.Allowed = false
	a.Decision.RetryAfter = max(a.Decision.RetryAfter, ConcurrencyRetryAfter)
	out.deny("")
	if reason == ReasonShed || a.shed || a.Rule.Prioritized() {
		out.Shed = rules.PriorityName(a.Class())
	}
	if ao, ok := e.obs.(AdaptiveObserver); ok {
		ao.Shed(a.Rule.Name, a.Class())
	}
}

// enforceAdaptive is enforce for enforce rules of which some are
// adaptive: their slots are taken first, in this engine (waiting up to
// their max_wait), then the other rules all or nothing in the store
// (peeked when an adaptive rule denied); when those deny, the slots are
// given back.
func (e *Engine) enforceAdaptive(ctx context.Context, rs *Rules, out *Outcome, enf []Applied) {
	var ad []*Applied
	var rest []Applied
	for i := range enf {
		if enf[i].Rule.Adaptive != nil {
			ad = append(ad, &enf[i])
		} else {
			rest = append(rest, enf[i])
		}
	}
	denied := e.admit(ctx, ad)
	if denied != nil {
		e.shedBy(out, denied, ReasonOverloaded)
		if out.Reason == "" {
			out.Reason = ReasonOverloaded
		}
	}
	if len(rest) > 0 {
		e.enforce(ctx, rs, out, rest, denied != nil)
		j := 0
		for i := range enf {
			if enf[i].Rule.Adaptive == nil {
				enf[i] = rest[j]
				j++
			}
		}
	}
	if !out.Allowed && denied == nil {
		unadmit(ad)
	}
}

// nameClass names the request's class in the outcome of a denial by a
// rule with priorities at its limit (not shed for its class, which
// shedBy named): the answer says which class was denied either way.
func (e *Engine) nameClass(out *Outcome) {
	a := out.Top
	if out.Allowed || out.Shed != "" || a == nil || !a.Rule.Prioritized() || a.Reason == "" || a.Reason == ReasonStoreUnavailable {
		return
	}
	out.Shed = rules.PriorityName(a.Class())
	if ao, ok := e.obs.(AdaptiveObserver); ok {
		ao.Shed(a.Rule.Name, a.Class())
	}
}
