package rules

import "github.com/driplimit/drip/engine/retryafter"

// retryJitter reads retry_after_jitter: {"fraction": 0.5, "max": "60s"};
// a field left out keeps its default.
func (c *checker) retryJitter(p string, v any, j *retryafter.Jitter) {
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
