package drip

import (
	"hash/fnv"
	"math"
	"time"
)

// JitterFraction returns a number in [0, 1) fixed by identity: the same
// identity always gets the same fraction, different identities spread
// evenly.
func JitterFraction(identity string) float64 {
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

// RetryAfterSeconds is the value of a Retry-After header for a wait of d:
// ceil(d) whole seconds plus a jitter of up to frac of that (SPEC 3 uses
// 0.5), fixed by identity. The jitter is rounded to whole seconds up or
// down at random, again fixed by identity, with the odds of its fraction,
// so that even one-second waits spread (over clients, 1 or 2 s; on average
// 1 s plus the jitter). The result lies in [ceil(d), ceil(d) +
// ceil(frac*ceil(d))]. It is 0 for d <= 0.
func RetryAfterSeconds(identity string, d time.Duration, frac float64) int64 {
	if d <= 0 {
		return 0
	}
	raw := math.Ceil(d.Seconds())
	j := raw * frac * JitterFraction(identity)
	u := JitterFraction("retry-after\x00" + identity) // a second fraction, independent of the first
	return int64(raw + math.Floor(j+u))
}
