package engine

import (
	"context"
	"sync"
	"time"

	"github.com/driplimit/drip"
	"github.com/driplimit/drip/bucket"
	"github.com/driplimit/drip/rules"
)

// DecideItems decides a request whose limits a front door matched
// itself, such as Envoy's descriptors. It takes one Applied per limit,
// made by NewApplied, with the request's Key, Cost and Mode.
//
// The modes go in this order. Refund items come first, so a failing
// store fails the request before anything is taken. Charge items go
// into bounded debt and never deny. Check items are peeked at their
// cost; one over its limit denies. Enforce and EnforceQuota items are
// taken all or nothing in one store call. An EnforceQuota item over its
// limit is left out, and the call is asked again without it. Shadow and
// ShadowQuota items come last: taken when the request is allowed, else
// peeked. Their failure changes no answer.
//
// An item that can never be allowed (the zero Limit, or Never) is over
// its limit without a store call. When the request is denied anyway, the
// enforced items are only peeked, for the headers.
//
// The outcome's Applied are copies of as, decided, each with its Event.
// When the store fails a refund, a charge or the take, every item is
// Failed, nothing more is asked, and Err says why.
//
// It is the orchestration of Decide too, for the rules that apply to a
// request (decide.go), so every front door decides alike.
//
// A door that is done with the outcome (its answer written, nothing of
// the outcome kept) may hand it back with Recycle, for the next call.
func (e *Engine) DecideItems(ctx context.Context, as []Applied) *Outcome {
	out := itemOutcomes.Get().(*Outcome)
	out.eng, out.items = e, true
	if len(as) <= len(out.first) {
		out.Applied = out.first[:len(as)]
	} else {
		out.Applied = make([]Applied, len(as))
	}
	copy(out.Applied, as)
	var buf [8]*Item // on the stack for a few items
	items := buf[:0]
	for i := range out.Applied {
		a := &out.Applied[i]
		a.blocked, a.item = a.Limit == drip.Limit{}, true
		items = append(items, &a.Item)
	}
	allowed, err := e.decideItems(ctx, items)
	if err != nil {
		out.Err = err
		for i := range out.Applied {
			out.Applied[i].Event = Failed
		}
		return out
	}
	out.Allowed = allowed
	for i := range out.Applied {
		out.Applied[i].Event = out.Applied[i].itemEvent()
	}
	out.pickItems()
	return out
}

// itemOutcomes are the outcomes of DecideItems handed back (Recycle):
// an Envoy call's outcome was about a sixth of the bytes its server
// allocated (BENCHMARKS.md).
var itemOutcomes = sync.Pool{New: func() any { return new(Outcome) }}

// Recycle hands back an outcome of DecideItems that its caller is done
// with: neither it nor its Applied may be used after. It does nothing to
// any other outcome (Decide's, which Release and Settle may use later).
func (out *Outcome) Recycle() {
	if out == nil || !out.items {
		return
	}
	*out = Outcome{}
	itemOutcomes.Put(out)
}

// NewApplied returns rule applied, its limit compiled once, for a door
// that matches limits itself (Envoy's descriptors). The door makes one
// when it loads the limit. It copies it for each request to DecideItems,
// with the request's Key, Cost and Mode.
func NewApplied(rule *rules.Rule) Applied {
	return Applied{Rule: rule, Item: Item{Limit: rule.Limit, Plan: PlanOf(rule.Name, rule.Limit)}}
}

// itemEvent is what became of an item of DecideItems that the store
// decided.
func (a *Applied) itemEvent() Event {
	switch {
	case a.Failed:
		return Failed
	case a.Mode == Charge && !a.Decided: // nothing to charge
		return Settled
	case a.blocked || !a.Decided || (!a.Decision.Allowed && a.Mode != Charge):
		return Denied
	case a.Mode == Refund:
		return Refunded
	case a.Mode == Charge && a.Forgiven:
		return Forgiven
	case a.Mode == Charge:
		return Charged
	case !a.Changed:
		return NotTaken
	}
	return Allowed
}

func (e *Engine) decideItems(ctx context.Context, items []*Item) (allowed bool, err error) {
	if err := e.runItems(ctx, e.timeout, defaultBreaker, items, refundItems, false, false); err != nil {
		return false, err
	}
	if err := e.chargeItems(ctx, items); err != nil {
		return false, err
	}
	allowed, err = e.takeItems(ctx, e.timeout, defaultBreaker, items, false)
	if err != nil {
		return false, err
	}
	e.shadowItems(ctx, e.timeout, defaultBreaker, items, !allowed)
	return allowed, nil
}

// itemKind is which step of DecideItems an item belongs to.
type itemKind uint8

const (
	enforceItems itemKind = iota
	shadowItems
	refundItems
	chargeItems
	checkItems
	blockedItems // never stepped
)

func (it *Item) kind() itemKind {
	if it.blocked {
		return blockedItems
	}
	switch it.Mode {
	case Shadow, ShadowQuota:
		return shadowItems
	case Check:
		return checkItems
	case Refund:
		return refundItems
	case Charge:
		return chargeItems
	}
	return enforceItems
}

// quota reports whether the item counts in the quota: an EnforceQuota
// item (a ShadowQuota one only lets the request pass).
func (it *Item) quota() bool { return it.Mode == EnforceQuota }

// takeItems decides the enforced items (peek: the request is denied
// anyway, so they are only peeked; peekZero: at cost 0, the buckets as
// they are). A request is allowed when none of the items outside quota
// mode is over its limit and, if it has quota items, one of them is not
// (or a Shadow one is in quota mode): the items are taken all or
// nothing, and a quota item over its limit leaves the take (Out), which
// is asked again without it, until the take is allowed, an item outside
// quota mode denies, or no quota item is left. What left takes nothing.
func (e *Engine) takeItems(ctx context.Context, timeout time.Duration, br rules.Breaker, items []*Item, peekZero bool) (bool, error) {
	// An item that can never be allowed is over its limit without asking
	// the store, and so is the request (a quota item only leaves the
	// quota items that may pass).
	denied, quotas, quotaPass := false, 0, false
	checks := false
	for _, it := range items {
		k := it.kind()
		if k == checkItems {
			checks = true
			continue
		}
		if k == refundItems || k == chargeItems {
			continue
		}
		switch it.Mode {
		case ShadowQuota:
			quotaPass = true // a limit in shadow mode is never over
			continue
		case Shadow:
			continue
		}
		if it.quota() {
			quotas++
		}
		if k == blockedItems || it.Never() {
			if it.quota() {
				it.Out = true
			} else {
				denied = true
			}
		}
	}
	if checks {
		// Peeked at their cost (a Never one at 0, then denied): a
		// peek cannot hold what it saw, so a bound on what passes
		// them is the caller's to state (count_status, docs).
		if err := e.runItems(ctx, timeout, br, items, checkItems, true, false); err != nil {
			return false, err
		}
		for _, it := range items {
			if it.kind() == checkItems && it.Decided && !it.Decision.Allowed {
				denied = true
			}
		}
	}
	for {
		open := quotaPass || quotas == 0
		for _, it := range items {
			if it.quota() && !it.Out {
				open = true
			}
		}
		peek := denied || !open
		if err := e.runItems(ctx, timeout, br, items, enforceItems, peek, peekZero); err != nil {
			return false, err
		}
		if peek {
			return false, nil
		}
		over := false
		for _, it := range items {
			if it.kind() != enforceItems || it.Out || !it.Decided || it.Decision.Allowed {
				continue
			}
			if !it.quota() {
				return false, nil
			}
			it.Out, over = true, true
		}
		if !over {
			if checks && takesSlot(items) {
				return e.recheck(ctx, timeout, br, items)
			}
			return true, nil
		}
	}
}

// takesSlot reports whether the take holds a slot of a concurrency rule.
func takesSlot(items []*Item) bool {
	for _, it := range items {
		if it.kind() == enforceItems && it.Changed && it.plan().algo.slots {
			return true
		}
	}
	return false
}

// recheck peeks the Check items again once the take holds its slots.
// The first peek came before the slots: a request of the same key that
// held them meanwhile may have settled its charge since (count_status),
// and only a peek under the slot sees it. One over its limit now denies
// the request: what was taken is given back, and each enforce item shows
// its bucket as it is.
func (e *Engine) recheck(ctx context.Context, timeout time.Duration, br rules.Breaker, items []*Item) (bool, error) {
	err := e.runItems(ctx, timeout, br, items, checkItems, true, false)
	denied := err != nil
	for _, it := range items {
		if it.kind() == checkItems && it.Decided && !it.Decision.Allowed {
			denied = true
		}
	}
	if !denied {
		return true, nil
	}
	e.giveBack(ctx, timeout, br, items)
	for _, it := range items {
		if it.kind() == enforceItems {
			it.Decision.Allowed = true
		}
	}
	return false, err
}

// shadowItems decides the Shadow items: taken, or peeked when peek (the
// request was denied). A failure marks them Failed.
func (e *Engine) shadowItems(ctx context.Context, timeout time.Duration, br rules.Breaker, items []*Item, peek bool) {
	if err := e.runItems(ctx, timeout, br, items, shadowItems, peek, false); err != nil {
		for _, it := range items {
			if it.kind() == shadowItems {
				it.Failed = true
			}
		}
	}
}

// runItems decides the items of kind k in one store step: a take (all or
// nothing), a peek when peek is set (at cost 0 when peekZero), or a
// refund. Items that can never be allowed are left undecided, except that
// an enforced one is peeked at cost 0 when peek is set, so that its
// bucket can be told of, and then decided as denied; Out items keep
// their last decision.
func (e *Engine) runItems(ctx context.Context, timeout time.Duration, br rules.Breaker, items []*Item, k itemKind, peek, peekZero bool) error {
	var step, never []*Item
	for _, it := range items {
		if it.kind() != k || it.Out {
			continue
		}
		it.Decision, it.Decided, it.Changed, it.Taken = drip.Decision{}, false, false, 0
		it.ask = it.Cost
		if peek && peekZero {
			it.ask = 0
		}
		if k != refundItems && it.Never() {
			if (k != enforceItems && k != checkItems) || !peek {
				continue
			}
			it.ask = 0
			never = append(never, it)
		}
		step = append(step, it)
	}
	if len(step) == 0 {
		return nil
	}
	op := bucket.Take
	switch {
	case k == refundItems:
		op = bucket.Refund
	case peek:
		op = bucket.Peek
	}
	if err := e.step(ctx, timeout, br, op, step); err != nil {
		return err
	}
	for _, it := range never {
		it.Decision.Allowed = false
	}
	return nil
}

// chargeItems takes the Charge items with a reservation, each at most
// the burst plus its debt bound (debtBound), in one store call (and one
// more for those the bound refused: chargeReqs); items of one key add up.
func (e *Engine) chargeItems(ctx context.Context, items []*Item) error {
	var reqs []drip.Request
	var its, firsts []*Item // firsts[j]: the first item of reqs[j]
	for _, it := range items {
		if it.kind() != chargeItems {
			continue
		}
		it.Decision, it.Decided, it.Changed, it.Forgiven, it.Taken = drip.Decision{}, false, false, false, 0
		if it.plan().algo.slots || it.Cost <= 0 {
			continue // a slot is held, not charged; nothing to charge
		}
		it.req = -1
		for j, r := range reqs { // items of one key are one bucket: their costs add up
			if r.Key == it.Key {
				it.req = int32(j)
				reqs[j].Cost += it.Cost
			}
		}
		if it.req < 0 {
			it.req = int32(len(reqs))
			reqs = append(reqs, drip.Request{Key: it.Key, Limit: it.Limit, Cost: it.Cost})
			firsts = append(firsts, it)
		}
		its = append(its, it)
	}
	asked := make([]float64, len(reqs))
	for j, r := range reqs {
		asked[j] = r.Cost
		reqs[j] = chargeReq(r.Key, r.Limit, firsts[j].plan(), r.Cost)
	}
	if len(reqs) == 0 {
		return nil
	}
	plans := make([]*Plan, len(firsts))
	for j, it := range firsts {
		plans[j] = it.plan()
	}
	decs, charged, err := e.chargeReqs(ctx, e.timeout, defaultBreaker, reqs, plans)
	if err != nil {
		return err
	}
	for _, it := range its {
		j := it.req
		it.Decision, it.Decided, it.Changed, it.Taken = decs[j], true, true, charged[j]
		it.Forgiven = charged[j] < asked[j]
	}
	return nil
}
