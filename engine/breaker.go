package engine

import (
	"sync"
	"sync/atomic"
	"time"
)

// Breaker states, as reported to Observer.BreakerState.
const (
	BreakerClosed   = "closed"    // the store is called
	BreakerOpen     = "open"      // the store is failing: not called until the cool-down ends
	BreakerHalfOpen = "half_open" // one probe call is deciding whether the store is back
)

// breaker is a circuit breaker in front of the store: after a number of
// consecutive failures it opens, and the store is not called (each request
// goes straight to its fail policy, costing no deadline) until a cool-down
// has passed; then a single probe call is let through, and its outcome
// closes the breaker or opens it again.
//
// Every call carries the ticket allow gave it, and only outcomes that
// belong to the breaker's current state count: the probe's outcome (of the
// current half-open state) closes or reopens it; a call let through while
// closed counts only while the breaker is still in that same closed state.
// A call that started before the breaker opened may finish after: its
// success does not close the breaker, and its failure does not count
// against the next closed state. The generation tells states apart.
type breaker struct {
	closed atomic.Bool   // fast path: true while closed
	gen    atomic.Uint64 // bumped on every change of state

	failures atomic.Int64 // consecutive failures in the current closed state

	mu        sync.Mutex
	state     string
	openUntil time.Time
	probing   bool
}

// ticket is what allow gives a call: the generation it started in, and
// whether it is the half-open probe.
type ticket struct {
	gen   uint64
	probe bool
}

func newBreaker() *breaker {
	b := &breaker{state: BreakerClosed}
	b.closed.Store(true)
	return b
}

// allow reports whether the store may be called at now, and the ticket to
// report the call's outcome with.
func (b *breaker) allow(now time.Time) (ok bool, t ticket, changed string) {
	g := b.gen.Load() // before closed: a change in between makes the ticket stale, never wrong
	if b.closed.Load() {
		return true, ticket{gen: g}, ""
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	switch b.state {
	case BreakerClosed:
		return true, ticket{gen: b.gen.Load()}, ""
	case BreakerOpen:
		if now.Before(b.openUntil) {
			return false, ticket{}, ""
		}
		b.set(BreakerHalfOpen)
		b.probing = true
		return true, ticket{gen: b.gen.Load(), probe: true}, BreakerHalfOpen
	default: // half open: one probe at a time
		if b.probing {
			return false, ticket{}, ""
		}
		b.probing = true
		return true, ticket{gen: b.gen.Load(), probe: true}, ""
	}
}

// set moves to state (the caller holds mu).
func (b *breaker) set(state string) {
	b.state = state
	b.gen.Add(1)
	b.failures.Store(0)
	b.probing = false
	b.closed.Store(state == BreakerClosed)
}

// current reports whether t belongs to the breaker's current state (the
// caller holds mu).
func (b *breaker) current(t ticket) bool {
	return t.gen == b.gen.Load() && t.probe == (b.state == BreakerHalfOpen)
}

// success records a call that worked: the probe's closes the breaker; a
// call of the current closed state resets the count of failures; any other
// (stale) success changes nothing.
func (b *breaker) success(t ticket) (changed string) {
	if !t.probe {
		if b.closed.Load() && b.gen.Load() == t.gen && b.failures.Load() != 0 {
			b.failures.Store(0)
		}
		return ""
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.current(t) {
		return ""
	}
	b.set(BreakerClosed)
	return BreakerClosed
}

// failure records a failed call at now: the breaker opens for cooldown
// after threshold consecutive failures of the current closed state, or at
// once when the probe failed. A stale failure changes nothing.
func (b *breaker) failure(now time.Time, threshold int, cooldown time.Duration, t ticket) (changed string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.current(t) {
		return ""
	}
	if !t.probe && b.failures.Add(1) < int64(threshold) {
		return ""
	}
	b.set(BreakerOpen)
	b.openUntil = now.Add(cooldown)
	return BreakerOpen
}

// abandon records a call whose outcome says nothing about the store (its
// caller gave up): nothing is counted, and if it was the probe, the next
// call becomes the probe.
func (b *breaker) abandon(t ticket) {
	if !t.probe {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.current(t) {
		b.probing = false
	}
}

// State returns the breaker's state.
func (b *breaker) State() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.state
}
