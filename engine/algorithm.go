package engine

import "github.com/driplimit/drip"

// algo is what an algorithm means for the engine. The engine reads it
// from a limit's Plan; it never switches on the algorithm itself.
// A new algorithm adds one entry to algorithms (ARCHITECTURE.md,
// "Adding an algorithm").
type algo struct {
	// reason is a denial's Reason.
	reason string
	// slots: a request holds one of the limit's slots, under a lease.
	// Its cost is a slot, its headers tell no window, and a release
	// wakes the first request waiting for one.
	slots bool
	// counted: the limit is a count within a window, not a refill.
	// It holds no debt, and its local share scales the count.
	counted bool
}

// algorithms holds every algorithm's facts.
var algorithms = map[drip.Algorithm]algo{
	drip.TokenBucket:   {reason: ReasonTokenBucket},
	drip.FixedWindow:   {reason: ReasonFixedWindow},
	drip.SlidingWindow: {reason: ReasonSlidingWindow, counted: true},
	drip.Concurrency:   {reason: ReasonConcurrency, slots: true},
}

// algoOf is l's facts. The zero Algorithm is a token bucket.
func algoOf(l *drip.Limit) algo {
	a, ok := algorithms[l.Algorithm]
	if !ok {
		return algorithms[drip.TokenBucket]
	}
	if l.Calendar != "" {
		a.counted = true // a calendar period counts within its window
	}
	return a
}
