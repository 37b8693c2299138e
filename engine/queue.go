package engine

import (
	"context"
	"math"
	"math/bits"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/driplimit/drip"
	"github.com/driplimit/drip/bucket"
	"github.com/driplimit/drip/rules"
)

// PollInterval is how often the first request waiting for a slot of a
// concurrency rule asks the store again. A release through this engine
// wakes it at once; a release in another instance sharing the store is
// seen at its next ask, within PollInterval.
const PollInterval = 100 * time.Millisecond

// QueueObserver is an Observer that also hears of the requests that wait
// (Item.Wait). Queued gets +1 when one joins rule's queue and -1 when it
// leaves. Waited tells how long it waited and whether it passed. Other
// Observers see the decisions only. A wrapper of an Observer forwards it
// when it can.
type QueueObserver interface {
	Observer
	Queued(rule string, delta int)
	Waited(rule string, d time.Duration, allowed bool)
}

// queues are the requests that wait in one engine for rate and
// concurrency rules: each rule's queue (Item.Queue), the line for each
// concurrency bucket's slots, and the reservations held by the waiters
// of each rate bucket (by sigOf). Each is a line, served as the adaptive
// rules' queues are: highest class first.
type queues struct {
	mu    sync.Mutex
	rules map[string]line  // by Item.Queue
	slots map[string]line  // by concurrency bucket key
	held  map[string]*dues // by sigOf
}

// waiter is one request in a queue: its class of priority (and, in an
// adaptive rule's queue, the share of the capacity its class may use),
// when it joined and when its wait ends, and its wakeup.
type waiter struct {
	class        int
	share        float64
	since, until time.Time
	// ch wakes it: in an adaptive rule's queue, true when it was granted
	// a slot, false when a higher class dropped it; in the engine's
	// queues, a turn to look again (dropped tells why).
	ch chan bool
	// load is, in an adaptive rule's queue, the requests in flight when
	// it was granted its slot, itself included.
	load int

	// In the engine's queues (under queues.mu):
	queues  []string      // the rules' queues it is in
	slot    string        // the concurrency bucket it is in line for ("": none)
	sig     string        // the reservations it holds (sigOf; "": none)
	due     time.Time     // when the reservation it was given is due
	own     time.Time     // when the reservation it took is due
	dropped bool          // a waiter of a higher class took its place
	gone    chan struct{} // closed when it has left, what it held given back
}

// line is the waiters of one queue in the order they are served: by
// class, highest first, then by arrival. A waiter of a higher class is
// never behind one of a lower class, and a full queue drops its last.
type line []*waiter

// insert puts w after the waiters of its class and above.
func (l *line) insert(w *waiter) {
	i := sort.Search(len(*l), func(i int) bool { return (*l)[i].class < w.class })
	*l = slices.Insert(*l, i, w)
}

// remove takes w out of the line, and reports whether it was in it.
func (l *line) remove(w *waiter) bool {
	i := slices.Index(*l, w)
	if i < 0 {
		return false
	}
	*l = slices.Delete(*l, i, i+1)
	return true
}

// next is the waiter (of a line not empty) that a free slot goes to: of
// the highest class waiting, the first in line, first in first out,
// while it has waited less than half of its wait; past that the class's
// line is overloaded, and the slot goes to its last, last in first out,
// until its first is again one that has waited less. A line that only
// grows would otherwise serve every request near the end of its wait,
// when its client may have given up; last in first out serves most at
// once and lets the oldest run out their waits (answered as without a
// wait). The critical class is always served first in first out: its
// share is kept for it, so its line is short but for a moment (the
// upstream's capacity fell, and nothing completes for a latency), when
// serving the oldest first lets all of it through within its wait,
// where the newest first would let the oldest run out.
func (l line) next(now time.Time) *waiter {
	first := l[0]
	if !first.overloaded(now) {
		return first
	}
	last := 0
	for last+1 < len(l) && l[last+1].class == first.class {
		last++
	}
	return l[last]
}

// overloaded reports whether w, the first of its class in line, shows
// its class's line overloaded: below critical, it has waited half its
// wait.
func (w *waiter) overloaded(now time.Time) bool {
	return w.class < rules.PriorityCritical && now.Sub(w.since) > w.until.Sub(w.since)/4
}

// dropFor makes room in a full line for w and returns the waiter to
// drop: the line's last when w's class is lower; else, when w's own
// class is overloaded (served last in first out), the first of it, the
// one that waited longest and that would be served last; nil when
// neither (w is refused).
func (l *line) dropFor(w *waiter, now time.Time) *waiter {
	if len(*l) == 0 {
		return nil
	}
	if last := (*l)[len(*l)-1]; last.class < w.class {
		return last
	}
	i := sort.Search(len(*l), func(i int) bool { return (*l)[i].class <= w.class })
	if i < len(*l) && (*l)[i].class == w.class && (*l)[i].overloaded(now) {
		return (*l)[i]
	}
	return nil
}

// dues are the reservations held by the waiters of one signature (the
// same buckets at the same costs: any of them serves any of the
// waiters), and their waiters, by class, then by their own
// reservations' dues: the earliest due goes to the first in line, the
// highest class. A reservation is as good as another of the
// same cost on the same bucket, so handing them out by class passes
// no more than the store reserved by any instant.
type dues struct {
	line line
	at   []time.Time // sorted
}

// assign gives the i-th waiter the i-th earliest reservation, and wakes
// those whose due moved.
func (d *dues) assign() {
	for i, w := range d.line {
		if !w.due.Equal(d.at[i]) {
			w.due = d.at[i]
			wake(w.ch)
		}
	}
}

// waitOf is how long a take of items may wait for its turn: the
// shortest Wait of its enforced items, or 0 when one of them can never
// pass (no wait would help) or none waits.
func waitOf(items []*Item) time.Duration {
	var w time.Duration
	for _, it := range items {
		if it.kind() != enforceItems && it.kind() != blockedItems {
			continue
		}
		if it.quota() || it.kind() == blockedItems || it.Never() {
			return 0
		}
		if it.Wait > 0 && (w == 0 || it.Wait < w) {
			w = it.Wait
		}
	}
	return w
}

// waitable reports whether every enforced item that denied may wait. A
// Check item that denied never may (a count_status rule has no
// max_wait): no wait makes it pass, so the request is denied at once.
func waitable(items []*Item) bool {
	for _, it := range items {
		if k := it.kind(); (k == enforceItems || k == checkItems) && it.Decided && !it.Decision.Allowed && it.Wait <= 0 {
			return false
		}
	}
	return true
}

// takeWaiting is takeItems for the enforced take of a request whose
// items may wait (Item.Wait; none: takeItems itself). A take they deny
// waits in their rules' queues, at most the shortest Wait, served by
// class (Item.SetClass: highest first; a full queue drops its lowest
// waiter for a higher class, else denies the newcomer at once): a rate
// limit's item takes a reservation (a take into debt, bounded by what
// its limit refills within the wait left, so that no more pass than the
// limit allows) and the request sleeps until a reservation is due (the
// earliest held by its kind go to the highest class; a debt that is full
// gives back the reservation of a lower class for a higher one); a
// concurrency limit's item waits for a release (a wakeup) or its next
// ask (PollInterval), and asks again. An item that denies and may not
// wait denies at once. A request whose ctx ends while it waits leaves
// the queue and gives back what it holds.
func (e *Engine) takeWaiting(ctx context.Context, timeout time.Duration, br rules.Breaker, items []*Item, peekZero bool) (passed bool, failed error) {
	wait := waitOf(items)
	if wait <= 0 {
		return e.takeItems(ctx, timeout, br, items, peekZero)
	}
	return e.takeQueued(ctx, timeout, br, items, peekZero, wait)
}

// takeQueued is takeWaiting of items that may wait up to wait. It is a
// function of its own so that its deferred cleanup (not open-coded: too
// many returns) costs nothing on the path of items that may not wait.
func (e *Engine) takeQueued(ctx context.Context, timeout time.Duration, br rules.Breaker, items []*Item, peekZero bool, wait time.Duration) (passed bool, failed error) {
	start := time.Now()
	w := &waiter{class: classOfItems(items), since: start, until: start.Add(wait),
		ch: make(chan bool, 1), gone: make(chan struct{})}
	behind := e.queues.behind(items, w.class)
	var ok, asked bool
	var err error
	if !behind {
		ok, err = e.takeItems(ctx, timeout, br, items, peekZero)
		switch {
		case err != nil || !waitable(items):
			return ok, err
		case ok && roomy(items) && keptDue(items) == 0:
			return true, nil
		case !ok && !slotDenied(items) && noDebt(items):
			return false, nil
		}
		asked = ok || slotDenied(items) // a rate limit's denial: ask again for a reservation
	}
	victim, joined := e.queues.join(items, w)
	if !joined {
		if ok {
			return true, nil // the caller sheds it for its class (shedPriority)
		}
		if behind { // the bucket's decision, for the answer
			return e.takeItems(ctx, timeout, br, items, peekZero)
		}
		return false, nil
	}
	e.queued(items, 1)
	allowed := false
	defer func() {
		e.queues.leave(w)
		e.queued(items, -1)
		e.waited(items, time.Since(start), allowed)
		if !passed && failed == nil && e.queues.dropped(w) {
			shedWaiting(items) // a higher class took its place
		}
	}()
	if victim != nil && !gone(ctx, victim) {
		if ok {
			e.giveBack(ctx, timeout, br, items)
		}
		return false, nil
	}
	ask := !behind // ask now, or wait for a turn first
	for {
		left := time.Until(w.until)
		var due time.Duration // a reservation's
		if !asked && (ask || left <= 0) {
			reserve(items, left)
			ok, err = e.takeItems(ctx, timeout, br, items, peekZero)
			due = dueOf(items)
			reserve(items, 0)
			asked = true
		}
		if asked {
			asked = false
			due = max(due, keptDue(items))
			switch {
			case err != nil:
				return false, err
			case ok && e.queues.dropped(w):
				e.giveBack(ctx, timeout, br, items)
				return false, nil
			case ok && left > 0 && (!roomy(items) || due > left):
				e.giveBack(ctx, timeout, br, items) // and wait for room
				if due > left {
					return false, nil
				}
			case ok && left <= 0 && due > 0:
				// Its wait is over short of its class's share: the caller
				// sheds it (shedPriority), as without a wait.
				return true, nil
			case ok:
				if due > 0 {
					held, ok := e.queues.hold(ctx, w, items, due)
					if !ok {
						e.giveBack(ctx, timeout, br, items)
						return false, nil
					}
					for _, it := range items {
						if it.Decided && it.Decision.Allowed && it.Wait > 0 {
							// The wait it took: the reservation it passed
							// with, not its own, was due then (handed out
							// by class, an earlier one for a higher class).
							it.Decision.RetryAfter = held
						}
					}
				}
				allowed = true
				return true, nil
			case left <= 0 || !waitable(items) || e.queues.dropped(w):
				return false, nil
			case !slotDenied(items):
				// A rate limit's debt is full: a waiter of a lower class
				// that holds a reservation like it gives its back.
				v := e.queues.dropHolder(items, w)
				if v == nil || !gone(ctx, v) {
					return false, nil
				}
				ask = true
				continue
			}
		}
		e.queues.line(items, w)
		e.queues.await(ctx, w)
		if ctx.Err() != nil {
			return false, nil
		}
		ask = true
	}
}

// keptDue is how long the rate limits' tokens the items just took take
// to come back to the share of the capacity kept for higher classes
// (Item.SetClass): a waiting request of a lower class passes then, as if
// it had found that share left. 0: none keeps one, or enough is left.
func keptDue(items []*Item) time.Duration {
	var due time.Duration
	for _, it := range items {
		if it.kind() != enforceItems || it.keep == 0 || it.Wait <= 0 || it.plan().algo.slots || !it.Decided || !it.Decision.Allowed {
			continue
		}
		p := it.fixed()
		short := (it.keep*float64(p.Burst)/bucket.Micro - it.Decision.Tokens) * bucket.Micro
		if short <= 1e-3 || p.Rate <= 0 {
			continue
		}
		var d time.Duration
		if p.Kind == bucket.Continuous {
			d = time.Duration(math.Ceil(short * float64(p.Period) / float64(p.Rate)))
		} else {
			d = time.Duration(math.Ceil(short/float64(p.Rate))) * time.Duration(p.Period)
		}
		due = max(due, d)
	}
	return due
}

// sheds reports whether an item just allowed leaves less than the share
// of its limit's capacity kept for higher classes (Item.SetClass): the
// request is shed, what it took given back. A reservation of a queue
// kept the share already (reserve).
func sheds(it *Item) bool {
	if it.keep == 0 || !it.Decided || !it.Decision.Allowed || (it.Wait > 0 && it.Decision.RetryAfter > 0) {
		return false
	}
	left := it.Decision.Tokens
	if it.plan().algo.slots {
		left = float64(it.Decision.Remaining)
	}
	return left < it.plan().burst*it.keep-1e-9
}

// classOfItems is the class a request waits as: the lowest of its
// waiting items' (a request any of its rules ranks low is shed first).
func classOfItems(items []*Item) int {
	c := rules.PriorityCritical
	for _, it := range items {
		if it.Wait > 0 && it.kind() == enforceItems {
			c = min(c, it.Class())
		}
	}
	return c
}

// roomy reports whether the slots the items took leave their classes'
// shares of the capacities free (Item.SetClass): else the request waits
// on for a slot within its share.
func roomy(items []*Item) bool {
	for _, it := range items {
		if it.kind() == enforceItems && it.keep > 0 && it.plan().algo.slots && it.Decided && it.Decision.Allowed &&
			float64(it.Decision.Remaining) < it.plan().burst*it.keep-1e-9 {
			return false
		}
	}
	return true
}

// noDebt reports whether none of the items' rate limits may take a
// reservation: a take they deny then has nothing to wait for.
func noDebt(items []*Item) bool {
	for _, it := range items {
		if it.kind() == enforceItems && it.Decided && !it.Decision.Allowed && !it.plan().algo.slots && mayReserve(it) {
			return false
		}
	}
	return true
}

// mayReserve reports whether a waiting item may take a reservation: a
// rate limit's, unless it is leased (drip serve --leased: decided from
// blocks in this process, which hold no debt).
func mayReserve(it *Item) bool {
	return it.Wait > 0 && it.kind() == enforceItems && !it.plan().algo.slots && !it.plan().leased
}

// sigOf is what the reservations of a request that waits for rate
// limits only are: its buckets and costs (any reservation of the same
// signature serves it); "" when it waits for anything else.
func sigOf(items []*Item) string {
	var b strings.Builder
	for _, it := range items {
		if it.kind() != enforceItems {
			continue
		}
		if !mayReserve(it) {
			return ""
		}
		b.WriteString(it.Key)
		b.WriteByte(0)
		b.WriteString(strconv.FormatFloat(it.Cost, 'g', -1, 64))
		b.WriteByte(0)
	}
	return b.String()
}

// gone waits for the dropped waiter v to have left, what it held given
// back; false if ctx ended first.
func gone(ctx context.Context, v *waiter) bool {
	select {
	case <-v.gone:
		return true
	case <-ctx.Done():
		return false
	}
}

// TakeWaiting takes Enforce items all or nothing, as Apply takes
// requests. A denied take may wait for its turn, as Decide's rules do
// (Item.Wait). It serves the decision API's take with "wait". An
// allowed item that waited for a reservation has the wait it took as
// its Decision's RetryAfter.
//
// Items of a class below critical (Item.SetClass) must leave their share
// of the capacity free, as Decide's rules with a reserve: an item that
// allowed a take but would eat into that share denies it (what was taken
// is given back), its Decision denied and Shed set. So are the items a
// request waited for when a higher class took its place.
func (e *Engine) TakeWaiting(ctx context.Context, items []*Item) (allowed bool, err error) {
	allowed, err = e.takeWaiting(ctx, e.timeout, defaultBreaker, items, false)
	if !allowed || err != nil {
		return allowed, err
	}
	for _, it := range items {
		if sheds(it) {
			e.giveBack(ctx, e.timeout, defaultBreaker, items)
			it.Decision.Allowed = false
			it.Decision.RetryAfter = max(it.Decision.RetryAfter, ConcurrencyRetryAfter)
			it.Shed = true
			return false, nil
		}
	}
	return true, nil
}

// shedWaiting marks the items a request waited for as shed for its
// class: a waiter of a higher class took its place.
func shedWaiting(items []*Item) {
	for _, it := range items {
		if it.Wait > 0 && it.kind() == enforceItems {
			it.Shed = true
		}
	}
}

// reserve sets the items' reservations for a wait of left: a rate
// limit's item that waits may run into the debt its limit refills within
// left (debtWithin); 0 takes plainly.
func reserve(items []*Item, left time.Duration) {
	for _, it := range items {
		it.debt = 0
		if left > 0 && mayReserve(it) {
			// A class that keeps a share of the capacity for higher ones
			// keeps it of the debt too: its reservation leaves the last
			// share of what the limit refills within the wait to them.
			kept := int64(it.keep * float64(it.fixed().Burst))
			it.debt = max(0, debtWithin(it.fixed(), min(left, it.Wait))-kept)
		}
	}
}

// debtWithin is the most debt (micro-tokens) that a limit of params p
// pays back within d: a reservation into it is due within d. A
// continuous refill pays rate/period per nanosecond; an interval refill
// or a fixed window pays its rate at each of the whole periods within d.
func debtWithin(p *bucket.Params, d time.Duration) int64 {
	if d <= 0 || p.Period <= 0 {
		return 0
	}
	const most = 1e18
	switch p.Kind {
	case bucket.Continuous:
		hi, lo := bits.Mul64(uint64(p.Rate), uint64(d))
		if hi >= uint64(p.Period) {
			return most
		}
		q, _ := bits.Div64(hi, lo, uint64(p.Period))
		return int64(min(q, most))
	case bucket.Interval, bucket.Window:
		n := int64(d) / p.Period
		if n > 0 && p.Rate > math.MaxInt64/n {
			return most
		}
		return min(p.Rate*n, most)
	}
	return 0
}

// dueOf is when the reservations just taken are due: the longest wait
// of the items that reserved.
func dueOf(items []*Item) time.Duration {
	var due time.Duration
	for _, it := range items {
		if it.debt > 0 && it.Decided && it.Decision.Allowed {
			due = max(due, it.Decision.RetryAfter)
		}
	}
	return due
}

// slotDenied reports whether a concurrency item denied the take: only
// a release can then let it pass, and it waits for one. (A rate item
// that denied a take with its reservation would need more debt than its
// limit pays back within the wait: waiting longer cannot help.)
func slotDenied(items []*Item) bool {
	for _, it := range items {
		if it.kind() == enforceItems && it.Decided && !it.Decision.Allowed && !it.plan().algo.slots {
			return false
		}
	}
	return true
}

// sleep waits d, and reports false if ctx ended first.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// giveBack returns what a request that left its queue held: its
// reservations (refunded; their rules then show the request denied) and
// the slots it acquired (released), in one store call on a context of
// its own.
func (e *Engine) giveBack(ctx context.Context, timeout time.Duration, br rules.Breaker, items []*Item) {
	var reqs []drip.Request
	var plans []*Plan
	for _, it := range items {
		if it.kind() != enforceItems || !it.Changed {
			continue
		}
		r := drip.Request{Key: it.Key, Limit: it.Limit, Cost: it.Cost, Lease: it.Lease}
		if it.plan().algo.slots {
			r.Cost = 0
		} else {
			it.Decision.Allowed = false
		}
		reqs, plans = append(reqs, r), append(plans, it.plan())
		it.Changed = false
	}
	if len(reqs) == 0 {
		return
	}
	if _, err := e.applyPlans(context.WithoutCancel(ctx), timeout, br, bucket.Refund, reqs, plans); err != nil {
		e.logError("giving back a waiter's reservation", err)
	}
}

func (e *Engine) queued(items []*Item, delta int) {
	if qo, ok := e.obs.(QueueObserver); ok {
		for _, it := range items {
			if it.Wait > 0 {
				qo.Queued(it.Queue, delta)
			}
		}
	}
}

func (e *Engine) waited(items []*Item, d time.Duration, allowed bool) {
	if qo, ok := e.obs.(QueueObserver); ok {
		for _, it := range items {
			if it.Wait > 0 {
				qo.Waited(it.Queue, d, allowed)
			}
		}
	}
}

// WaitsUntil is the latest end of the waits of the requests waiting in
// the engine's queues now (zero: none waits). A graceful shutdown lets
// them wait that long for their turn.
func (e *Engine) WaitsUntil() time.Time {
	q := &e.queues
	q.mu.Lock()
	var until time.Time
	for _, l := range q.rules {
		for _, w := range l {
			if w.until.After(until) {
				until = w.until
			}
		}
	}
	q.mu.Unlock()
	// The adaptive rules' own queues (adaptive.go).
	as := &e.adapt
	as.mu.RLock()
	for _, a := range as.m {
		a.mu.Lock()
		for _, w := range a.waiters {
			if w.until.After(until) {
				until = w.until
			}
		}
		a.mu.Unlock()
	}
	as.mu.RUnlock()
	return until
}

// join puts the request w in the queue of each of its items that waits.
// When one of those is full (Item.MaxQueue) it drops the queue's last
// waiter, of a lower class than w, and returns it (it leaves, giving
// back what it holds); when none is lower it puts w nowhere and reports
// false.
func (q *queues) join(items []*Item, w *waiter) (victim *waiter, ok bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.rules == nil {
		q.rules = make(map[string]line)
		q.slots = make(map[string]line)
		q.held = make(map[string]*dues)
	}
	for _, it := range items {
		if it.Wait <= 0 || slices.Contains(w.queues, it.Queue) {
			continue
		}
		w.queues = append(w.queues, it.Queue)
		l := q.rules[it.Queue]
		if len(l) < max(it.MaxQueue, 1) {
			continue
		}
		v := l.dropFor(w, time.Now())
		if v == nil || (victim != nil && victim != v) {
			w.queues = nil
			return nil, false
		}
		victim = v
	}
	if victim != nil {
		q.drop(victim)
	}
	for _, name := range w.queues {
		l := q.rules[name]
		l.insert(w)
		q.rules[name] = l
	}
	return victim, true
}

// drop takes v out of its rules' queues for a waiter of a higher class
// and wakes it: it leaves at once.
func (q *queues) drop(v *waiter) {
	v.dropped = true
	q.unqueue(v)
	wake(v.ch)
}

// unqueue takes w out of its rules' queues.
func (q *queues) unqueue(w *waiter) {
	for _, name := range w.queues {
		l := q.rules[name]
		if l.remove(w); len(l) == 0 {
			delete(q.rules, name)
		} else {
			q.rules[name] = l
		}
	}
	w.queues = nil
}

// dropped reports whether a waiter of a higher class took w's place.
func (q *queues) dropped(w *waiter) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return w.dropped
}

// dropHolder drops, for w, the last waiter of a lower class that holds
// reservations like w's would be (sigOf), and returns it; nil if none.
func (q *queues) dropHolder(items []*Item, w *waiter) *waiter {
	sig := sigOf(items)
	q.mu.Lock()
	defer q.mu.Unlock()
	h := q.held[sig]
	if sig == "" || h == nil {
		return nil
	}
	for i := len(h.line) - 1; i >= 0; i-- {
		v := h.line[i]
		if v.class >= w.class {
			return nil
		}
		if !v.dropped {
			q.drop(v)
			return v
		}
	}
	return nil
}

// hold sleeps until the reservations the request just took (due in d)
// may be used: among the waiters holding reservations like them, the
// earliest due go to the highest class. It returns when the one it
// passed with was due (from its start: the wait it took), and false
// when ctx ended or a higher class dropped the request first: the
// caller gives them back.
func (q *queues) hold(ctx context.Context, w *waiter, items []*Item, d time.Duration) (time.Duration, bool) {
	sig := sigOf(items)
	start := time.Now()
	if sig == "" {
		return d, sleep(ctx, d)
	}
	q.mu.Lock()
	h := q.held[sig]
	if h == nil {
		h = &dues{}
		q.held[sig] = h
	}
	at := start.Add(d)
	h.at = slices.Insert(h.at, sort.Search(len(h.at), func(i int) bool { return h.at[i].After(at) }), at)
	// By class, then by the reservations taken: within a class each
	// passes with its own (the order they joined in may not be theirs).
	w.own = at
	i := sort.Search(len(h.line), func(i int) bool {
		v := h.line[i]
		return v.class < w.class || (v.class == w.class && v.own.After(at))
	})
	h.line = slices.Insert(h.line, i, w)
	w.sig = sig
	h.assign()
	q.mu.Unlock()
	for {
		q.mu.Lock()
		if w.dropped {
			q.mu.Unlock()
			return 0, false
		}
		left := time.Until(w.due)
		if left <= 0 { // its turn: it passes with the earliest
			h.line.remove(w)
			h.at = slices.Delete(h.at, 0, 1)
			w.sig = ""
			q.unheld(sig, h)
			q.mu.Unlock()
			return w.due.Sub(start), true
		}
		q.mu.Unlock()
		if !sleepOrWake(ctx, w.ch, left) {
			return 0, false
		}
	}
}

// unheld forgets h when it holds nothing, else hands out its dues again.
func (q *queues) unheld(sig string, h *dues) {
	if len(h.line) == 0 {
		delete(q.held, sig)
		return
	}
	h.assign()
}

// sleepOrWake waits d or a wakeup on ch, and reports false if ctx ended
// first.
func sleepOrWake(ctx context.Context, ch chan bool, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ch:
	case <-ctx.Done():
		return false
	}
	return true
}

// behind reports whether requests of w's class or higher already wait
// here for a slot of one of the items' concurrency buckets: the request
// then joins their line (next) rather than take a slot freed for one of
// them.
func (q *queues) behind(items []*Item, class int) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	for _, it := range items {
		if it.Wait > 0 && it.plan().algo.slots {
			if l := q.slots[it.Key]; len(l) > 0 && l[0].class >= class {
				return true
			}
		}
	}
	return false
}

// slotKey is the concurrency bucket whose slot the request waits for:
// the first of its waiting concurrency items.
func slotKey(items []*Item) (string, bool) {
	for _, it := range items {
		if it.Wait > 0 && it.kind() == enforceItems && it.plan().algo.slots {
			return it.Key, true
		}
	}
	return "", false
}

// line puts the request w in the line for its slot, by class, if it
// waits for one and is not in line yet.
func (q *queues) line(items []*Item, w *waiter) {
	key, ok := slotKey(items)
	q.mu.Lock()
	defer q.mu.Unlock()
	if !ok || w.slot != "" || w.dropped {
		return
	}
	w.slot = key
	l := q.slots[key]
	l.insert(w)
	q.slots[key] = l
}

// await waits for the request's turn to ask again: a wakeup, or, for the
// next in line, PollInterval (one that is no longer next when its poll
// comes, a higher class having joined ahead, waits on); until the end of
// its wait, and until ctx ends.
func (q *queues) await(ctx context.Context, w *waiter) {
	for {
		left := time.Until(w.until)
		if left <= 0 {
			return
		}
		if q.turn(w) {
			left = min(left, PollInterval)
		}
		t := time.NewTimer(left)
		select {
		case <-w.ch:
			t.Stop()
			return
		case <-t.C:
			if w.slot == "" || q.turn(w) {
				return
			}
			q.handOn(w) // its poll goes to the next in line now
		case <-ctx.Done():
			t.Stop()
			return
		}
	}
}

// turn reports whether w is the next in line for its slot.
func (q *queues) turn(w *waiter) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	l := q.slots[w.slot]
	return w.slot != "" && len(l) > 0 && l.next(time.Now()) == w
}

// handOn wakes the next in line for w's slot to ask in its place.
func (q *queues) handOn(w *waiter) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if l := q.slots[w.slot]; len(l) > 0 {
		wake(l.next(time.Now()).ch)
	}
}

// leave takes the request w out of its queues: when it was the next in
// line for its slot, it wakes the one next now; when it held
// reservations (given back by the caller), the latest due of its kind
// goes with it.
func (q *queues) leave(w *waiter) {
	q.mu.Lock()
	defer q.mu.Unlock()
	defer close(w.gone)
	q.unqueue(w)
	if w.sig != "" {
		h := q.held[w.sig]
		h.line.remove(w)
		h.at = h.at[:len(h.at)-1]
		q.unheld(w.sig, h)
		w.sig = ""
	}
	if w.slot == "" {
		return
	}
	key := w.slot
	now := time.Now()
	l := q.slots[key]
	turn := len(l) > 0 && l.next(now) == w
	l.remove(w)
	if len(l) == 0 {
		delete(q.slots, key)
		return
	}
	q.slots[key] = l
	if turn {
		wake(l.next(now).ch)
	}
}

// released wakes the next request waiting for a slot of key: one was
// released here.
func (q *queues) released(key string) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if l := q.slots[key]; len(l) > 0 {
		wake(l.next(time.Now()).ch)
	}
}

func wake(ch chan bool) {
	select {
	case ch <- true:
	default:
	}
}
