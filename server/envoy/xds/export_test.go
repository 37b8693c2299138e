package xds

import "time"

// Wait is Backoff.wait, for the tests.
func Wait(b Backoff, n int, rnd func() float64) time.Duration { return b.wait(n, rnd) }

// SetClock makes c wait on after instead of time.After between the NACKs
// of a version sent again, and draw its jitter from rnd.
func SetClock(c *Client, after func(time.Duration) <-chan time.Time, rnd func() float64) {
	c.after, c.rnd = after, rnd
}
