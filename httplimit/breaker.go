package httplimit

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
type breaker struct {
	closed atomic.Bool // fast path: true while closed

	failures atomic.Int64 // consecutive failures

	mu        sync.Mutex
	state     string
	openUntil time.Time
	probing   bool
}

func newBreaker() *breaker {
	b := &breaker{state: BreakerClosed}
	b.closed.Store(true)
	return b
}

// allow reports whether the store may be called at now; probe is true when
// this call is the half-open probe, whose outcome must be reported.
func (b *breaker) allow(now time.Time) (ok, probe bool, changed string) {
	if b.closed.Load() {
		return true, false, ""
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	switch b.state {
	case BreakerClosed:
		return true, false, ""
	case BreakerOpen:
		if now.Before(b.openUntil) {
			return false, false, ""
		}
		b.state, b.probing = BreakerHalfOpen, true
		return true, true, BreakerHalfOpen
	default: // half open: one probe at a time
		if b.probing {
			return false, false, ""
		}
		b.probing = true
		return true, true, ""
	}
}

// success records a call that worked; it closes the breaker.
func (b *breaker) success(probe bool) (changed string) {
	if b.closed.Load() && !probe {
		if b.failures.Load() != 0 {
			b.failures.Store(0)
		}
		return ""
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.failures.Store(0)
	b.probing = false
	if b.state != BreakerClosed {
		b.state = BreakerClosed
		b.closed.Store(true)
		return BreakerClosed
	}
	return ""
}

// failure records a failed call at now; the breaker opens for cooldown
// after threshold consecutive failures, or at once when the probe failed.
func (b *breaker) failure(now time.Time, threshold int, cooldown time.Duration, probe bool) (changed string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	n := b.failures.Add(1)
	if probe || (b.state == BreakerClosed && n >= int64(threshold)) {
		b.probing = false
		b.openUntil = now.Add(cooldown)
		if b.state != BreakerOpen {
			b.state = BreakerOpen
			b.closed.Store(false)
			return BreakerOpen
		}
	}
	return ""
}

// State returns the breaker's state.
func (b *breaker) State() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.state
}
