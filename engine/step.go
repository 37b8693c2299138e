package engine

import (
	"context"
	"errors"
	"time"

	"github.com/driplimit/drip"
	"github.com/driplimit/drip/bucket"
	"github.com/driplimit/drip/rules"
	"github.com/driplimit/drip/store"
)

// Item is one limit of a request: a bucket key, its limit, the request's
// cost, and how it takes part (Shadow, Refund, Charge, Check, Quota, Blocked); the
// decision fills in the rest. Each rule Decide applies is one (Applied);
// a front door that matches limits itself (Envoy's descriptors) hands
// its own to DecideItems. Items that share a key are one bucket: their
// costs add up.
type Item struct {
	Key   string
	Limit drip.Limit
	Cost  float64
	// Lease is, for a concurrency limit, the lease the step acquires (a
	// take), releases (a refund) or asks about (a peek). Items on a
	// concurrency limit never share a key.
	Lease string

	// Shadow items are decided after the enforced ones and never deny:
	// taken when the request is allowed, else peeked.
	Shadow bool
	// Refund items are given back (Envoy's is_negative_hits), before
	// anything is taken.
	Refund bool
	// Quota items (Envoy's quota mode) do not deny the request on their
	// own: one over its limit leaves the take (Out), and the request is
	// allowed when one of them (or a Shadow one) is within its limit.
	Quota bool
	// Charge items are work already done (Envoy's apply_on_stream_done
	// call): taken with a reservation, into debt at most DebtBound of
	// their limit (what would pass it is Forgiven), after the refunds and
	// before anything is decided; they never deny the request.
	Charge bool
	// Forgiven reports a Charge item charged less than its cost (or
	// nothing): its bucket's debt would have passed the bound.
	Forgiven bool
	// Check items are only peeked at their cost, before the take: one
	// over its limit denies the request, and they take nothing (a
	// count_status rule: its cost is taken after the response, when its
	// status matches, Outcome.Settle).
	Check bool
	// Blocked items never allow (a limit of 0): they are over their
	// limit without asking the store.
	Blocked bool

	// Decision is the bucket's decision, for a shared key of the costs
	// added (Taken); meaningful when Decided.
	Decision drip.Decision
	Decided  bool
	// Changed reports that the bucket changed: a take whose whole was
	// allowed, or a refund.
	Changed bool
	// Taken is the cost the bucket was asked for: its items' costs added,
	// at most its burst; for Charge items, what the bucket was charged.
	Taken float64
	// Out reports a Quota item found over its limit and left out of the
	// take: it took nothing, and Decision is its last.
	Out bool
	// Failed reports a Shadow item whose store call failed.
	Failed bool

	// Params is Limit in drip's fixed point (drip.Limit.Params, for any
	// key: its burst decides Never), compiled once when the front door
	// loaded the limit; nil, it is computed from Limit when needed.
	Params *bucket.Params

	ask float64 // the cost asked in this step: Cost, or 0 for a peek at the bucket as it is
	req int     // its store request
}

// Never reports whether the item can never be allowed: its cost exceeds
// its limit's burst (overBurst).
func (it *Item) Never() bool { return overBurst(it.Limit, it.fixed(), it.Cost) }

// fixed is the item's limit in drip's fixed point: Params, else computed
// now. A limit that allows nothing (Envoy's requests_per_unit 0, a
// Blocked item) has a burst of 0.
func (it *Item) fixed() bucket.Params {
	if it.Params == nil {
		p, _ := it.Limit.Params("")
		it.Params = &p
	}
	return *it.Params
}

// overBurst reports whether a take of cost under l (p in fixed point)
// can never be allowed: the engine's one such verdict, for rules, the
// local fallback, Envoy's descriptors and shared keys alike. It is the
// stores' own, in fixed point (store.Cost); a concurrency limit, whose
// requests hold a slot each, is over when the cost is above its slots.
func overBurst(l drip.Limit, p bucket.Params, cost float64) bool {
	if l.Concurrent() {
		return cost > float64(l.MaxInFlight)
	}
	_, err := store.Cost(bucket.Take, cost, false, p)
	return errors.Is(err, store.ErrCostExceedsBurst)
}

// step makes one all-or-nothing store call for items, through the breaker
// and under the deadline (apply): a take, a peek or a refund of each
// item's ask. A take of a bucket whose items' asks add up past its burst
// can never be allowed: the whole step is then a peek, at the burst, and
// that bucket denies (a refund past the burst just fills the bucket).
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
			reqs[j].Cost += it.ask
			continue
		}
		it.req = len(reqs)
		reqs = append(reqs, drip.Request{Key: it.Key, Limit: it.Limit, Cost: it.ask, Lease: it.Lease})
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
	for _, it := range items {
		j := it.req
		if (over != nil && over[j]) || !overBurst(reqs[j].Limit, it.fixed(), reqs[j].Cost) {
			continue
		}
		if over == nil {
			over = make([]bool, len(reqs))
		}
		over[j] = true
		reqs[j].Cost = Burst(reqs[j].Limit)
		if op == bucket.Take {
			op = bucket.Peek
		}
	}
	m, err := e.apply(ctx, timeout, br, op, reqs)
	if err != nil {
		return m, err
	}
	for _, it := range items {
		it.Decision, it.Decided, it.Taken = m.Decisions[it.req], true, reqs[it.req].Cost
		it.Changed = op == bucket.Refund || (op == bucket.Take && m.Allowed)
		if over != nil && over[it.req] && op == bucket.Peek {
			it.Decision.Allowed = false
		}
	}
	return m, nil
}
