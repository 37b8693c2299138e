package rules

import (
	"time"

	"github.com/driplimit/drip"
)

// MaxWait is the longest max_wait a rule may set, and the longest a
// request may ask to wait (the decision API's "wait").
const MaxWait = time.Minute

// DefaultMaxQueue is a rule's max_queue when it sets max_wait alone.
const DefaultMaxQueue = 100

// MaxQueue is the largest max_queue a rule may set: each waiting request
// holds its connection and a goroutine.
const MaxQueue = 10000

// waitFields reads a rule's max_wait and max_queue: a request the rule
// would deny may wait up to max_wait for its turn instead, in a queue of
// at most max_queue requests per rule in each instance.
func (c *checker) waitFields(f *fields, r *Rule) {
	v, fp, ok := f.get("max_wait")
	if ok {
		if d, ok := c.duration(fp, v, false); ok {
			if d > MaxWait {
				c.add(fp, "must be at most %v", MaxWait)
			}
			r.MaxWait = d
		}
		switch {
		case r.Mode == Shadow:
			c.add(fp, "does not apply to a shadow rule (it never denies, so nothing waits)")
		case r.Limit.Algorithm == drip.SlidingWindow:
			c.add(fp, "does not apply to sliding_window (it takes no reservations, which waiting holds)")
		case r.Limit.Calendar != "":
			c.add(fp, "does not apply to a calendar period (it takes no reservations, which waiting holds)")
		case r.Limit.Leased:
			c.add(fp, "does not apply to a leased rule (its blocks are decided in each instance)")
		case len(r.CountStatus) > 0:
			c.add(fp, "does not apply to a count_status rule (it only checks its bucket before the request)")
		}
	}
	if v, fp, ok := f.get("max_queue"); ok {
		if r.MaxWait == 0 {
			c.add(fp, "applies with max_wait only")
		}
		if n, ok := c.integer(fp, v, 1, MaxQueue); ok {
			r.MaxQueue = n
		}
	} else if r.MaxWait > 0 {
		r.MaxQueue = DefaultMaxQueue
	}
}
