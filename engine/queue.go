package engine

import (
	"context"
	"math"
	"math/bits"
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

// queues are the requests that wait in one engine: how many under each
// rule (Item.Queue), each waiter, and, for each concurrency bucket, the
// waiters for its slots in arrival order.
type queues struct {
	mu      sync.Mutex
	n       map[string]int
	waiting map[*inLine]struct{}
	slots   map[string][]*inLine
}

// inLine is one request in the queues: when it joined, when its wait
// ends, and, once it waits for a concurrency slot, its wakeup.
type inLine struct {
	since, deadline time.Time
	ch              chan struct{} // nil: it waits for no slot (yet)
}

// next is the waiter of line (not empty) that a free slot goes to: the
// first in line, first in first out, while it has waited less than half
// of its wait; past that the line is overloaded, and the slot goes to
// the last in line, last in first out, until the line's first is again
// one that has waited less. A line that only grows would otherwise
// serve every request near the end of its wait, when its client may
// have given up; last in first out serves most at once and lets the
// oldest run out their waits (answered as without a wait).
func next(line []*inLine, now time.Time) *inLine {
	first := line[0]
	if now.Sub(first.since) > first.deadline.Sub(first.since)/2 {
		return line[len(line)-1]
	}
	return first
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

// waitable reports whether every enforced item that denied may wait.
func waitable(items []*Item) bool {
	for _, it := range items {
		if it.kind() == enforceItems && it.Decided && !it.Decision.Allowed && it.Wait <= 0 {
			return false
		}
	}
	return true
}

// takeWaiting is takeItems for the enforced take of a request whose
// items may wait (Item.Wait; none: takeItems itself). A take they deny
// waits in their rules' queues, at most the shortest Wait: a rate
// limit's item takes a reservation (a take into debt, bounded by what
// its limit refills within the wait left, so that no more pass than the
// limit allows) and the request sleeps until it is due; a concurrency
// limit's item waits for a release (a wakeup) or its next ask
// (PollInterval), and asks again. A full queue, or an item that denies
// and may not wait, denies at once. A request whose ctx ends while it
// waits leaves the queue and gives back what it holds.
func (e *Engine) takeWaiting(ctx context.Context, timeout time.Duration, br rules.Breaker, items []*Item, peekZero bool) (bool, error) {
	wait := waitOf(items)
	if wait <= 0 {
		return e.takeItems(ctx, timeout, br, items, peekZero)
	}
	start := time.Now()
	deadline := start.Add(wait)
	behind := e.queues.behind(items)
	if !behind {
		allowed, err := e.takeItems(ctx, timeout, br, items, peekZero)
		if err != nil || allowed || !waitable(items) {
			return allowed, err
		}
	}
	w := &inLine{since: start, deadline: deadline}
	if !e.queues.join(items, w) {
		if behind { // the bucket's decision, for the answer
			return e.takeItems(ctx, timeout, br, items, peekZero)
		}
		return false, nil
	}
	e.queued(items, 1)
	allowed := false
	defer func() {
		e.queues.leave(items, w)
		e.queued(items, -1)
		e.waited(items, time.Since(start), allowed)
	}()
	ask := !behind // ask now, or wait for a turn first
	for {
		left := time.Until(deadline)
		if ask || left <= 0 {
			reserve(items, left)
			ok, err := e.takeItems(ctx, timeout, br, items, peekZero)
			due := dueOf(items)
			reserve(items, 0)
			if err != nil {
				return false, err
			}
			if ok {
				if due > 0 && !sleep(ctx, due) {
					e.giveBack(ctx, timeout, br, items)
					return false, nil
				}
				allowed = true
				return true, nil
			}
			if left <= 0 || !waitable(items) || !slotDenied(items) {
				return false, nil
			}
		}
		e.queues.line(items, w)
		e.queues.await(ctx, w, items, time.Until(deadline))
		if ctx.Err() != nil {
			return false, nil
		}
		ask = true
	}
}

// TakeWaiting takes Enforce items all or nothing, as Apply takes
// requests. A denied take may wait for its turn, as Decide's rules do
// (Item.Wait). It serves the decision API's take with "wait".
func (e *Engine) TakeWaiting(ctx context.Context, items []*Item) (allowed bool, err error) {
	return e.takeWaiting(ctx, e.timeout, defaultBreaker, items, false)
}

// reserve sets the items' reservations for a wait of left: a rate
// limit's item that waits may run into the debt its limit refills within
// left (debtWithin); 0 takes plainly.
func reserve(items []*Item, left time.Duration) {
	for _, it := range items {
		it.debt = 0
		// A leased limit (drip serve --leased) is decided from blocks in
		// this process, which hold no debt: it does not wait.
		if left > 0 && it.Wait > 0 && it.kind() == enforceItems && !it.plan().algo.slots && !it.plan().leased {
			it.debt = debtWithin(it.fixed(), min(left, it.Wait))
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
		reqs = append(reqs, r)
		it.Changed = false
	}
	if len(reqs) == 0 {
		return
	}
	if _, err := e.apply(context.WithoutCancel(ctx), timeout, br, bucket.Refund, reqs); err != nil {
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
	for w := range q.waiting {
		if w.deadline.After(until) {
			until = w.deadline
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

// join counts the request w in the queue of each of its items that
// waits, unless one of those is full (Item.MaxQueue): then it counts
// nothing and reports false.
func (q *queues) join(items []*Item, w *inLine) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.n == nil {
		q.n = make(map[string]int)
		q.waiting = make(map[*inLine]struct{})
	}
	for _, it := range items {
		if it.Wait > 0 && q.n[it.Queue] >= max(it.MaxQueue, 1) {
			return false
		}
	}
	for _, it := range items {
		if it.Wait > 0 {
			q.n[it.Queue]++
		}
	}
	q.waiting[w] = struct{}{}
	return true
}

// behind reports whether requests already wait here for a slot of one
// of the items' concurrency buckets: the request then joins their line
// (next) rather than take a slot freed for one of them.
func (q *queues) behind(items []*Item) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	for _, it := range items {
		if it.Wait > 0 && it.plan().algo.slots && len(q.slots[it.Key]) > 0 {
			return true
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

// line puts the request w at the end of the line for its slot, if it
// waits for one and is not in line yet.
func (q *queues) line(items []*Item, w *inLine) {
	key, ok := slotKey(items)
	if !ok || w.ch != nil {
		return
	}
	w.ch = make(chan struct{}, 1)
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.slots == nil {
		q.slots = make(map[string][]*inLine)
	}
	q.slots[key] = append(q.slots[key], w)
}

// await waits for the request's turn to ask again: a wakeup, or, for the
// next in line, PollInterval; at most left, and until ctx ends.
func (q *queues) await(ctx context.Context, w *inLine, items []*Item, left time.Duration) {
	if left <= 0 {
		return
	}
	if w.ch != nil {
		key, _ := slotKey(items)
		q.mu.Lock()
		line := q.slots[key]
		turn := len(line) > 0 && next(line, time.Now()) == w
		q.mu.Unlock()
		if turn {
			left = min(left, PollInterval)
		}
	}
	t := time.NewTimer(left)
	defer t.Stop()
	select {
	case <-w.ch: // nil: never
	case <-t.C:
	case <-ctx.Done():
	}
}

// leave takes the request w out of its queues; when it was the next in
// line for its slot, it wakes the one next now.
func (q *queues) leave(items []*Item, w *inLine) {
	q.mu.Lock()
	defer q.mu.Unlock()
	for _, it := range items {
		if it.Wait > 0 {
			if q.n[it.Queue]--; q.n[it.Queue] <= 0 {
				delete(q.n, it.Queue)
			}
		}
	}
	delete(q.waiting, w)
	if w.ch == nil {
		return
	}
	key, _ := slotKey(items)
	now := time.Now()
	line := q.slots[key]
	turn := len(line) > 0 && next(line, now) == w
	for i, x := range line {
		if x == w {
			line = append(line[:i:i], line[i+1:]...)
			break
		}
	}
	if len(line) == 0 {
		delete(q.slots, key)
		return
	}
	q.slots[key] = line
	if turn {
		wake(next(line, now).ch)
	}
}

// released wakes the next request waiting for a slot of key: one was
// released here.
func (q *queues) released(key string) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if line := q.slots[key]; len(line) > 0 {
		wake(next(line, time.Now()).ch)
	}
}

func wake(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}
