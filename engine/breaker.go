package engine

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/driplimit/drip/rules"
)

// Breaker states, as reported to Observer.BreakerState.
const (
	BreakerClosed   = "closed"    // the store is called
	BreakerOpen     = "open"      // the store is failing: not called until the cool-down ends
	BreakerHalfOpen = "half_open" // one probe call is deciding whether the store is back
)

// BreakerWindow is how long the breaker counts calls and failures before
// it starts counting afresh (while closed).
const BreakerWindow = time.Second

// breaker is a circuit breaker in front of the store. It opens when the
// store is down, not when a few calls are slow:
//
//   - failures: within a window (BreakerWindow), at least Failures calls
//     failed and they were at least FailureRatio of the calls that ended.
//     A failure is a connection that failed (refused, reset), an error
//     that says the server cannot serve (shutting down, out of memory, a
//     replica), or a call that missed its deadline while the store
//     answered nothing else; a call that missed its deadline while the
//     store was answering other calls is a slow call, and an error the
//     store answered about the call's own items (store.AnsweredError: a
//     script or statement that failed on their values) is the store
//     working: both are counted as calls but not as failures;
//   - a stall: Stall has passed since a call was sent and the store has
//     answered nothing at all in that time, while that call or (if its
//     caller gave up) others still wait (engine.apply's stall timer calls
//     stalled).
//
// Open, the store is not called (each request goes straight to its
// on_error, costing no deadline) until Cooldown has passed; then a single
// probe call is let through, and its outcome closes the breaker or opens
// it again for another Cooldown.
//
// Every call carries the ticket allow gave it, and only outcomes that
// belong to the breaker's current state count: the probe's outcome (of the
// current half-open state) closes or reopens it; a call let through while
// closed counts only while the breaker is still in that same closed state.
// A call that started before the breaker opened may finish after: its
// success does not close the breaker, and its failure does not count
// against the next closed state. The generation tells states apart.
//
// Why not a breaker module (sony/gobreaker): its counts take a lock on
// every call where this one's closed path is two atomic adds; it has no
// notion of a call that says nothing about the store (its caller gave up,
// a bad input), of a slow call apart from a failed one, or of a stall
// seen before any call ends; and the engine injects its clock
// (WithClock), which gobreaker reads from the time package.
type breaker struct {
	closed atomic.Bool   // fast path: true while closed
	gen    atomic.Uint64 // bumped on every change of state

	// The current window's counts (closed state): calls that ended, and
	// failures among them; winEnd is when the window ends, in the
	// engine's clock (UnixNano). The counts are a heuristic: a call
	// counted just as the window turns may land in either.
	winEnd atomic.Int64
	calls  atomic.Int64
	fails  atomic.Int64

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
	b.winEnd.Store(0)
	b.calls.Store(0)
	b.fails.Store(0)
	b.probing = false
	b.closed.Store(state == BreakerClosed)
}

// current reports whether t belongs to the breaker's current state (the
// caller holds mu).
func (b *breaker) current(t ticket) bool {
	return t.gen == b.gen.Load() && t.probe == (b.state == BreakerHalfOpen)
}

// count adds a call that ended at now (and a failure, if failed) to the
// current window, starting a new window when the last one is over.
func (b *breaker) count(now time.Time, failed bool) (calls, fails int64) {
	n := now.UnixNano()
	if end := b.winEnd.Load(); n >= end && b.winEnd.CompareAndSwap(end, n+int64(BreakerWindow)) {
		b.calls.Store(0)
		b.fails.Store(0)
	}
	calls = b.calls.Add(1)
	if failed {
		return calls, b.fails.Add(1)
	}
	return calls, b.fails.Load()
}

// success records a call that worked, or that was slow (it missed its
// deadline while the store answered other calls): the probe's closes the
// breaker (a slow probe reached a store that answers); a call of the
// current closed state is counted; any other (stale) outcome changes
// nothing.
func (b *breaker) success(now time.Time, t ticket) (changed string) {
	if !t.probe {
		if b.closed.Load() && b.gen.Load() == t.gen {
			b.count(now, false)
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

// failure records a failed call at now: the breaker opens for the
// cool-down when the window's failures reach the thresholds of cfg, or at
// once when the probe failed. A stale failure changes nothing.
func (b *breaker) failure(now time.Time, cfg rules.Breaker, t ticket) (changed string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.current(t) {
		return ""
	}
	if !t.probe {
		calls, fails := b.count(now, true)
		if fails < int64(cfg.Failures) || float64(fails) < cfg.FailureRatio*float64(calls) {
			return ""
		}
	}
	b.open(now, cfg)
	return BreakerOpen
}

// stalled records that t's call has waited cfg.Stall without the store
// answering anything: the breaker opens (whatever the counts), if t is of
// its current state.
func (b *breaker) stalled(now time.Time, cfg rules.Breaker, t ticket) (changed string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.current(t) {
		return ""
	}
	b.open(now, cfg)
	return BreakerOpen
}

func (b *breaker) open(now time.Time, cfg rules.Breaker) {
	b.set(BreakerOpen)
	b.openUntil = now.Add(cfg.Cooldown)
}

// abandon records a call whose outcome says nothing about the store (its
// caller gave up, a bad input, a call shed before it was made): nothing
// is counted, and if it was the probe, the next call becomes the probe.
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
