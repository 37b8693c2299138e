package rules

import (
	"hash/fnv"
	"math"
	"time"
)

// retryJitter reads retry_after_jitter: {"fraction": 0.5, "max": "60s"};
// a field left out keeps its default.
func (c *checker) retryJitter(p string, v any, j *Jitter) {
	f, ok := c.object(p, v)
	if !ok {
		return
	}
	if v, p, ok := f.get("fraction"); ok {
		if x, ok := c.num(p, v); ok {
			if x < 0 || x > 1 {
				c.add(p, "must be >= 0 and <= 1")
			} else {
				j.Fraction = x
			}
		}
	}
	if v, p, ok := f.get("max"); ok {
		if d, ok := c.duration(p, v, true); ok {
			j.Max = d
		}
	}
	f.done("fraction", "max")
}

// jitterFraction returns a number in [0, 1) fixed by identity: the same
// identity always gets the same fraction, different identities spread
// evenly.
func jitterFraction(identity string) float64 {
	h := fnv.New64a()
	h.Write([]byte(identity))
	// Mix the bits (splitmix64's finalizer) so that similar identities
	// land far apart.
	x := h.Sum64()
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return float64(x>>11) / (1 << 53)
}

// Jitter is how a Retry-After is spread over clients: by up to Fraction
// of the wait, and by at most Max.
//
// The spread breaks up a herd of clients denied at once; a minute does
// that for any herd. Beyond that it only costs the client: 50% of a
// one-day wait is twelve hours lost. DefaultJitter caps it at 60 seconds.
type Jitter struct {
	// Fraction of the wait (rounded up to whole seconds) the jitter may
	// add, from 0 (none) to 1.
	Fraction float64
	// Max is the most the jitter adds, rounded up to whole seconds; zero
	// means no jitter.
	Max time.Duration
}

// DefaultJitter is the jitter of drip's Retry-After headers: up to 50% of the
// wait, at most 60 seconds.
var DefaultJitter = Jitter{Fraction: 0.5, Max: time.Minute}

// Seconds returns the Retry-After value for a wait of d: ceil(d) whole
// seconds plus a jitter of up to min(Fraction*ceil(d), Max). identity
// fixes the jitter. It is rounded up or down at random, with the odds of
// its fraction, again fixed by identity. Even one-second waits then
// spread over clients. The result lies in [ceil(d), ceil(d) +
// ceil(min(Fraction*ceil(d), Max))]. It is 0 for d <= 0.
func (j Jitter) Seconds(identity string, d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	raw := math.Ceil(d.Seconds())
	span := min(raw*j.Fraction, math.Ceil(j.Max.Seconds()))
	if !(span > 0) {
		return int64(raw)
	}
	jit := span * jitterFraction(identity)
	u := jitterFraction("retry-after\x00" + identity) // a second fraction, independent of the first
	return int64(raw + math.Floor(jit+u))
}
