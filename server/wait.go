package server

import (
	"context"
	"slices"
	"time"

	"github.com/driplimit/drip"
	"github.com/driplimit/drip/bucket"
	"github.com/driplimit/drip/engine"
	"github.com/driplimit/drip/replay"
	"github.com/driplimit/drip/rules"
)

// checkWait refuses a "wait" where nothing waits: on an endpoint other
// than /v1/take and /v1/acquire, and beside "reserve" (a reservation
// already says when its work may run).
func checkWait(b replay.Raw, opName string) error {
	if b.Wait == 0 {
		return nil
	}
	if opName != "take" && opName != "acquire" {
		return inputf("/v1/%s does not wait: only /v1/take and /v1/acquire take \"wait\"", opName)
	}
	for _, it := range append([]replay.ReqJSON{b.ReqJSON}, b.Requests...) {
		if it.Reserve {
			return inputf("\"wait\" and \"reserve\" do not go together: a reservation says when its work may run (retry_after)")
		}
	}
	return nil
}

// take decides the API's requests p prepared, those at idx (nil: all;
// its are their items), under set: in one store call, or, for a take
// whose body asks to wait or that a rule with a reserve decides, through
// the engine's one queue (engine.TakeWaiting), each request in its
// rule's queue ("inline" for an inline limit) for at most wait, the
// server's MaxWait and the rule's max_wait, as of class (-1: each rule's
// own; a rule's reserve keeps its share of the capacity for higher
// classes).
func (s *Server) take(ctx context.Context, set *rules.Set, op bucket.Op, wait time.Duration, class int, its []replay.ReqJSON, p *engine.Prepared, idx []int) (drip.Multi, error) {
	if !waits(set, op, wait, its, idx) {
		return p.Apply(ctx, op, idx)
	}
	n := len(its)
	if idx != nil {
		n = len(idx)
	}
	items := make([]*engine.Item, n)
	for j := range items {
		i := j
		if idx != nil {
			i = idx[j]
		}
		r := p.Request(i)
		it := &engine.Item{Key: r.Key, Limit: r.Limit, Cost: r.Cost, Lease: r.Lease, Plan: p.Plan(i),
			Wait: min(wait, s.cfg.MaxWait), Queue: "inline", MaxQueue: rules.DefaultMaxQueue}
		c, share := class, 1.0
		if rule, ok := set.Rule(ruleOf(its[i])); ok {
			it.Queue = rule.Name
			if rule.MaxWait > 0 {
				it.Wait, it.MaxQueue = min(it.Wait, rule.MaxWait), rule.MaxQueue
			}
			if c < 0 {
				c = rule.Class()
			}
			share = rule.Share(c)
		}
		if c < 0 {
			c = rules.PriorityDefault
		}
		it.SetClass(c, share)
		items[j] = it
	}
	allowed, err := s.eng.TakeWaiting(ctx, items)
	if err != nil {
		return drip.Multi{}, err
	}
	m := drip.Multi{Allowed: allowed, Decisions: make([]drip.Decision, len(items))}
	for i, it := range items {
		d := it.Decision
		m.Decisions[i] = d
		if allowed || !d.Allowed {
			m.RetryAfter = max(m.RetryAfter, d.RetryAfter)
		}
	}
	return m, nil
}

// waits reports whether take decides the requests of its at idx (nil:
// all) as items that may wait (Engine.TakeWaiting) under set: a take
// that asks to wait, or one a rule keeps a reserve for higher classes
// against.
func waits(set *rules.Set, op bucket.Op, wait time.Duration, its []replay.ReqJSON, idx []int) bool {
	return op == bucket.Take && (wait > 0 || prioritized(set, its, idx))
}

// prioritized reports whether a rule of its at idx (nil: all) keeps a
// share of its capacity for higher classes (a reserve).
func prioritized(set *rules.Set, its []replay.ReqJSON, idx []int) bool {
	for j, it := range its {
		if idx != nil && !slices.Contains(idx, j) {
			continue
		}
		if r, ok := set.Rule(ruleOf(it)); ok && r.Prioritized() {
			return true
		}
	}
	return false
}
