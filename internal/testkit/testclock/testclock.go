// Package testclock is the settable clock of drip's tests. A limiter, a
// middleware or a store given Clock.Now decides at the time the test sets,
// so tests move time forward exactly instead of sleeping, and no assertion
// depends on how fast the machine runs.
package testclock

import (
	"sync"
	"time"
)

// Start is the time a clock made by New shows: a fixed instant, so that
// every run decides at the same times.
var Start = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

// Clock is a time that moves only when the test moves it. It is safe for
// concurrent use.
type Clock struct {
	mu sync.Mutex
	t  time.Time
}

// New is a clock at Start.
func New() *Clock { return At(Start) }

// At is a clock at t. Tests on a shared server start at the real time
// (At(time.Now())), since the server expires keys by its own clock.
func At(t time.Time) *Clock { return &Clock{t: t} }

// Now is the clock's time: pass it where a func() time.Time is wanted.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

// Add moves the clock by d.
func (c *Clock) Add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// Set moves the clock to t.
func (c *Clock) Set(t time.Time) {
	c.mu.Lock()
	c.t = t
	c.mu.Unlock()
}
