package engine

import (
	"context"
	"sync"
	"time"

	"github.com/driplimit/drip"
	"github.com/driplimit/drip/rules"
)

// Slot is a slot of an adaptive rule taken for a caller that tells the
// end of the request itself (the decision API's /v1/acquire and
// /v1/release), not a front door that sees it end. Release gives it
// back once.
type Slot struct {
	e    *Engine
	a    Applied
	b    *adaptive // a.slot, until released
	once sync.Once
}

// AcquireSlot takes a slot of the adaptive rule's bucket key for a
// request of class (rules.ParsePriority), waiting up to wait in the
// bucket's queue (of at most maxQueue) when there is none, as Decide's
// requests wait: highest class first, a full queue dropping its lowest.
// The decision tells of the bucket as the headers would (its learned
// capacity and free slots); a denial carries the class's name in shed
// when the class is what kept it out (its share of the capacity is
// used, or a higher class took its place). The engine's observer counts
// the decision. A caller whose ctx has ended takes no slot: it is
// denied, even when a slot was handed to it as it left the queue.
func (e *Engine) AcquireSlot(ctx context.Context, rule *rules.Rule, key string, class int, wait time.Duration, maxQueue int) (s *Slot, d drip.Decision, shed string) {
	a := Applied{Rule: rule, Item: Item{Key: key, Limit: rule.Limit, Wait: wait, Queue: rule.Name, MaxQueue: maxQueue}}
	a.SetClass(class, rule.Share(class))
	if denied := e.admit(ctx, []*Applied{&a}); denied != nil {
		out := &Outcome{}
		e.shedBy(out, &a, ReasonOverloaded)
		e.obs.Decision(rule.Name, rule.Mode, Denied)
		return nil, a.Decision, out.Shed
	}
	if ctx.Err() != nil {
		// The caller left before it asked, or as a slot was handed to
		// it in the queue: it takes nothing, and the rule learns
		// nothing (nobody would release the slot: held under a lease
		// nobody has, it would count as a failure at its TTL).
		unadmit([]*Applied{&a})
		a.Decision.Allowed, a.Decision.RetryAfter = false, ConcurrencyRetryAfter
		e.obs.Decision(rule.Name, rule.Mode, Denied)
		return nil, a.Decision, ""
	}
	e.obs.Decision(rule.Name, rule.Mode, Allowed)
	return &Slot{e: e, a: a, b: a.slot}, a.Decision, ""
}

// Release gives the slot back, and the rule learns from the request: it
// took from its acquire until now, and dropped (the upstream failed or
// was overloaded, or the caller never told: a lease that expired) or
// not. Only the first call counts.
// It returns the bucket as it is then.
func (s *Slot) Release(dropped bool) drip.Decision {
	s.once.Do(func() { s.a.releaseSlot(s.e.clock(), dropped, true) })
	d, _ := s.b.state(true)
	return d
}

// SlotState is the adaptive rule's bucket key as it is, as the headers
// would tell of it: its learned capacity and its free slots. It makes
// no bucket and pins none: a key it does not find (the set full, its
// rule's overflow bucket) is told of as a new bucket would be, so that
// asking about keys a client made up leaves nothing behind.
func (e *Engine) SlotState(rule *rules.Rule, key string) drip.Decision {
	a := e.adaptiveFound(rule, key)
	if a == nil {
		a = &adaptive{rule: rule.Name, cfg: rule.Adaptive, limit: float64(rule.Adaptive.InitialLimit)}
	}
	d, _ := a.state(true)
	return d
}
