package engine

import (
	"context"
	"time"

	"github.com/driplimit/drip"
	"github.com/driplimit/drip/bucket"
	"github.com/driplimit/drip/rules"
)

// Item is one limit of a request in a store step (Step): a bucket key,
// its limit and the request's cost. Items that share a key are one
// bucket: their costs add up.
type Item struct {
	Key   string
	Limit drip.Limit
	Cost  float64
	// Lease is, for a concurrency limit, the lease the step acquires (a
	// take), releases (a refund) or asks about (a peek). Items on a
	// concurrency limit never share a key.
	Lease string

	// Decision is the bucket's decision, for a shared key of the costs
	// added (Taken); meaningful when Decided.
	Decision drip.Decision
	Decided  bool
	// Applied reports that the step changed the bucket: a take whose
	// whole was allowed, or a refund.
	Applied bool
	// Taken is the cost the bucket was asked for: its items' costs added,
	// at most its burst.
	Taken float64

	req int // its store request
}

// Step makes one all-or-nothing store call for items, through the breaker
// and under the engine's deadline (Apply): a take, a peek or a refund. A
// take of a bucket whose items' costs add up past its burst can never be
// allowed: the whole step is then a peek, at the burst, and that bucket
// denies (a refund past the burst just fills the bucket).
func (e *Engine) Step(ctx context.Context, op bucket.Op, items []*Item) error {
	_, err := e.step(ctx, e.timeout, defaultBreaker, op, items)
	return err
}

func (e *Engine) step(ctx context.Context, timeout time.Duration, br rules.Breaker, op bucket.Op, items []*Item) (drip.Multi, error) {
	if len(items) == 0 {
		return drip.Multi{Allowed: true}, nil
	}
	reqs := make([]drip.Request, 0, len(items))
	var byKey map[string]int // beyond a few requests; a scan below
	for _, it := range items {
		j := -1
		if byKey != nil {
			if x, ok := byKey[it.Key]; ok {
				j = x
			}
		} else {
			for x := range reqs {
				if reqs[x].Key == it.Key {
					j = x
					break
				}
			}
		}
		if j >= 0 {
			it.req = j
			reqs[j].Cost += it.Cost
			continue
		}
		it.req = len(reqs)
		reqs = append(reqs, drip.Request{Key: it.Key, Limit: it.Limit, Cost: it.Cost, Lease: it.Lease})
		if byKey == nil && len(reqs) > 8 {
			byKey = make(map[string]int, len(items))
			for x, r := range reqs {
				byKey[r.Key] = x
			}
		} else if byKey != nil {
			byKey[it.Key] = it.req
		}
	}
	var over []bool
	for j := range reqs {
		if b := Burst(reqs[j].Limit); reqs[j].Cost > b {
			if over == nil {
				over = make([]bool, len(reqs))
			}
			over[j] = true
			reqs[j].Cost = b
			if op == bucket.Take {
				op = bucket.Peek
			}
		}
	}
	m, err := e.apply(ctx, timeout, br, op, reqs)
	if err != nil {
		return m, err
	}
	for _, it := range items {
		it.Decision, it.Decided, it.Taken = m.Decisions[it.req], true, reqs[it.req].Cost
		it.Applied = op == bucket.Refund || (op == bucket.Take && m.Allowed)
		if over != nil && over[it.req] && op == bucket.Peek {
			it.Decision.Allowed = false
		}
	}
	return m, nil
}
