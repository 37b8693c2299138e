package xds

import "time"

// Wait is Backoff.wait, for the tests.
func Wait(b Backoff, n int, rnd func() float64) time.Duration { return b.wait(n, rnd) }
