package engine

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/driplimit/drip"
	"github.com/driplimit/drip/bucket"
	"github.com/driplimit/drip/rules"
	"github.com/driplimit/drip/store"
)

// Item is one limit of a request: a bucket key, its limit, the request's
// cost, and how it takes part (Mode); the decision fills in its Verdict.
// Each rule Decide applies is one (Applied); a front door that matches
// limits itself (Envoy's descriptors) hands its own to DecideItems. Items
// that share a key are one bucket: their costs add up. An Item serves one
// decision: make a new one for the next (its verdicts, Never's, are made
// once).
type Item struct {
	Key   string
	Limit drip.Limit
	Cost  float64
	// Lease is, for a concurrency limit, the lease the step acquires (a
	// take), releases (a refund) or asks about (a peek). Items on a
	// concurrency limit never share a key.
	Lease string
	// Mode is how the item takes part in the decision (Enforce: taken
	// all or nothing with the others).
	Mode ItemMode
	// (Small fields of the item's own beside Mode, so that an Outcome
	// with its two Applied stays in one 1 KiB allocation.)
	never   verdict // Never, once made (costOf)
	blocked bool    // see below
	class   int8    // the request's class of priority (SetClass), 0 to 100
	req     int32   // its store request
	// Wait is how long an enforced item whose limit denies the request
	// may hold it in its queue instead (Engine.Decide: the rule's
	// max_wait), in Queue (a rule's name, in metrics) of at most MaxQueue
	// requests in this engine. Zero: it denies at once. DecideItems never
	// waits.
	Wait     time.Duration
	Queue    string
	MaxQueue int

	// Plan is Limit compiled (PlanOf): a rule's, or a door's, compiled
	// once when it loaded the limit. Nil: compiled from Limit when needed.
	Plan *Plan

	// Verdict is what the decision made of the item.
	Verdict

	micro   int64 // Cost in fixed point, as the store takes it (takeCost)
	costErr error // what is wrong with Cost, if anything
	// blocked (above): an item of DecideItems whose Limit is the zero
	// Limit, which allows nothing (Envoy's requests_per_unit 0): over its
	// limit without asking the store.

	ask  float64 // the cost asked in this step: Cost, or 0 for a peek at the bucket as it is
	debt int64   // a take's reservation: the most debt it may run up, in micro-tokens (0: a plain take)

	span int64   // a calendar window's length in the decision's window (policy)
	keep float64 // the share of the limit's capacity kept for higher classes
}

// Class is the request's class of priority under the item's rule: from
// 0 (batch) to 100 (critical); rules.PriorityName names it.
func (it *Item) Class() int { return int(it.class) }

// SetClass sets the request's class of priority and the share of the
// limit's capacity (rules.Rule.Share) that class may use. A waiting item
// is queued by it (highest class first; a full queue drops its lowest),
// and a concurrency item waits while taking its slot would leave less
// than the rest of the capacity free. Decide sets it from the rule; the
// zero Item is of class 0 with all the capacity.
func (it *Item) SetClass(class int, share float64) {
	it.class, it.keep = int8(min(max(class, math.MinInt8), math.MaxInt8)), 1-min(max(share, 0), 1)
}

// ItemMode is how an item takes part in a decision: one step of
// DecideItems each, and whether an enforced or shadow item is in quota
// mode (Envoy's quota_mode).
type ItemMode uint8

const (
	// Enforce items are taken all or nothing; one over its limit denies
	// the request.
	Enforce ItemMode = iota
	// EnforceQuota items are enforced in quota mode: one over its limit
	// does not deny the request on its own, but leaves the take (Out);
	// the request is allowed when one of them (or a ShadowQuota one) is
	// within its limit.
	EnforceQuota
	// Shadow items are decided after the enforced ones and never deny:
	// taken when the request is allowed, else peeked.
	Shadow
	// ShadowQuota items are Shadow items in quota mode: never over, they
	// let the request pass its quota.
	ShadowQuota
	// Check items are only peeked at their cost, before the take: one
	// over its limit denies the request, and they take nothing (a
	// count_status rule: its cost is taken after the response, when its
	// status matches, Outcome.Settle).
	Check
	// Refund items are given back (Envoy's is_negative_hits), before
	// anything is taken.
	Refund
	// Charge items are work already done (Envoy's apply_on_stream_done
	// call): taken with a reservation, into debt at most debtBound of
	// their limit (what would pass it is Forgiven), after the refunds and
	// before anything is decided; they never deny the request.
	Charge
)

// Verdict is what a decision made of an item.
type Verdict struct {
	// Decision is the bucket's decision, for a shared key of the costs
	// added (Taken); meaningful when Decided.
	Decision drip.Decision
	// Taken is the cost the bucket was asked for: its items' costs added,
	// at most its burst; for Charge items, what the bucket was charged.
	Taken   float64
	Decided bool
	// Changed reports that the bucket changed: a take whose whole was
	// allowed, or a refund.
	Changed bool
	// Out reports an EnforceQuota item found over its limit and left out
	// of the take: it took nothing, and Decision is its last.
	Out bool
	// Failed reports a Shadow item whose store call failed.
	Failed bool
	// Forgiven reports a Charge item charged less than its cost (or
	// nothing): its bucket's debt would have passed the bound.
	Forgiven bool
	// Shed reports an enforced item that denied the request for its
	// class of priority (SetClass, Engine.TakeWaiting): the take would
	// have eaten into the share kept for higher classes, or a waiter of
	// a higher class took its place in the queue.
	Shed bool
}

// Never reports whether the item can never be allowed: its cost exceeds
// its limit's burst (takeCost: the engine's one such verdict, for rules,
// the local fallback, Envoy's descriptors and shared keys alike). The verdict is made once, at the first
// ask, with the cost in fixed point (costOf): an item's limit and cost do
// not change during a decision (the local fallback, which changes the
// limit, makes new items).
func (it *Item) Never() bool {
	it.costOf()
	return it.never == yes
}

// costOf is the item's cost as its store takes it (takeCost), made once.
func (it *Item) costOf() (int64, error) {
	if it.never == unknown {
		c, over, err := takeCost(&it.Limit, it.plan(), it.Cost)
		it.micro, it.costErr, it.never = c, err, verdictOf(over)
	}
	return it.micro, it.costErr
}

// verdict is a yes or no made once, or not yet.
type verdict uint8

const (
	unknown verdict = iota
	no
	yes
)

func verdictOf(b bool) verdict {
	if b {
		return yes
	}
	return no
}

// Burst is the item's burst, as its plan holds it: the limit's burst in
// drip's fixed point, its slots for a concurrency limit, 0 for a limit
// that allows nothing.
func (it *Item) Burst() float64 { return it.plan().burst }

// plan is the item's Plan, compiled now if the door handed none.
func (it *Item) plan() *Plan {
	if it.Plan == nil {
		it.Plan = PlanOf("", it.Limit)
	}
	return it.Plan
}

// fixed is the item's limit in drip's fixed point. A limit that allows
// nothing (Envoy's requests_per_unit 0, a Blocked item) has a burst of 0.
func (it *Item) fixed() *bucket.Params { return &it.plan().params }

// takeCost is the store's cost of a take of cost under l (p in fixed
// point, store.Cost), and whether it can never be allowed: it exceeds the
// burst, as the stores hold it, in fixed point (the take is then one of
// the burst); for a concurrency limit, whose requests hold a slot each,
// when cost is above its slots (the take then holds one slot, as every
// take of a lease does). err is any other problem of the cost
// (store.Cost's: not a finite number from 0 to 1e12).
func takeCost(l *drip.Limit, pl *Plan, cost float64) (c int64, over bool, err error) {
	p := &pl.params
	if pl.algo.slots {
		if cost > float64(l.MaxInFlight) {
			return bucket.Micro, true, nil
		}
		c, err = store.Cost(bucket.Take, cost, false, *p)
		return c, false, err
	}
	c, err = store.Cost(bucket.Take, cost, false, *p)
	if errors.Is(err, store.ErrCostExceedsBurst) {
		return p.Burst, true, nil
	}
	return c, false, err
}

// step makes one all-or-nothing store call for items, through the breaker
// and under the deadline (call): a take, a peek or a refund of each
// item's ask. Items of one key are one bucket: their asks add up. A take
// of a bucket whose asks add up past its burst can never be allowed: the
// whole step is then a peek, at the burst, and that bucket denies (a
// refund past the burst just fills the bucket).
//
// The store executes the items' compiled params (Item.Plan, a window
// placed for its key and time by Plan.paramsAt), with the cost in fixed
// point; what depends on the request (the key, the cost, the lease) is
// checked here, once.
func (e *Engine) step(ctx context.Context, timeout time.Duration, br rules.Breaker, op bucket.Op, items []*Item) error {
	if len(items) == 0 {
		return nil
	}
	sc := scratches.Get().(*scratch)
	defer sc.free()
	reqs := sc.reqs[:0]
	var byKey map[string]int // beyond a few requests; a scan below
	for _, it := range items {
		j := -1
		if byKey != nil {
			if x, ok := byKey[it.Key]; ok {
				j = x
			}
		} else {
			for x := range reqs {
				if reqs[x].it.Key == it.Key {
					j = x
					break
				}
			}
		}
		if j >= 0 {
			it.req = int32(j)
			reqs[j].cost += it.ask
			continue
		}
		it.req = int32(len(reqs))
		reqs = append(reqs, stepReq{it: it, cost: it.ask})
		if byKey == nil && len(reqs) > 8 {
			byKey = make(map[string]int, len(items))
			for x, r := range reqs {
				byKey[r.it.Key] = x
			}
		} else if byKey != nil {
			byKey[it.Key] = int(it.req)
		}
	}
	sc.reqs = reqs
	for j := range reqs {
		r := &reqs[j]
		pl := r.it.plan()
		p := &pl.params
		switch {
		case r.cost == r.it.Cost: // the common case: one item a key, at its cost
			r.c, r.err = r.it.costOf()
			r.over = r.it.Never()
		default:
			r.c, r.over, r.err = takeCost(&r.it.Limit, pl, r.cost)
		}
		if r.over { // takeCost's cost: the burst
			r.cost = float64(p.Burst) / bucket.Micro
			if op == bucket.Take {
				op = bucket.Peek
			}
		}
	}
	if err := e.stepPrepared(ctx, timeout, br, op, sc); err != nil {
		return err
	}
	allowed := true
	for j := range reqs {
		allowed = allowed && reqs[j].d.Allowed
	}
	for _, it := range items {
		r := &reqs[it.req]
		it.Decision, it.Decided, it.Taken, it.span = r.d, true, r.cost, r.span
		it.Changed = op == bucket.Refund || (op == bucket.Take && allowed)
		if r.over && op == bucket.Peek {
			it.Decision.Allowed = false
		}
	}
	return nil
}

// stepPrepared is step's store call: each request checked (the key,
// the cost, the lease, in that order, as store.Prepare does) under its
// plan's params and handed to the store.
func (e *Engine) stepPrepared(ctx context.Context, timeout time.Duration, br rules.Breaker, op bucket.Op, sc *scratch) error {
	reqs := sc.reqs
	n := len(reqs)
	items, res := sc.sized(n)
	at := e.at()
	for j := range reqs {
		r := &reqs[j]
		reserve := op == bucket.Take && r.it.debt > 0
		if err := r.it.plan().prepare(&items[j], op, r.it.Key, at, r.c, r.err, reserve, r.it.Lease); err != nil {
			if n > 1 {
				err = fmt.Errorf("requests[%d]: %w", j, err)
			}
			e.refused(ctx, op, n, err)
			return err
		}
		if reserve {
			items[j].Params.MaxReserved = r.it.debt // a waiter's bound (queue.go)
		}
	}
	if err := e.call(ctx, timeout, br, op, at, items, res); err != nil {
		return err
	}
	for j := range reqs {
		pl := reqs[j].it.plan()
		pl.hints(&res[j], &items[j].Params, at)
		reqs[j].d = drip.DecisionOf(res[j], items[j].Params.Burst)
		if pl.dated {
			reqs[j].span = items[j].Params.Period
		}
	}
	return nil
}

// stepReq is one bucket of a step: its first item, the asks of its
// items added (in fixed point c, or what is wrong with them), whether
// they are over its burst, and its decision.
type stepReq struct {
	it   *Item
	cost float64
	c    int64
	err  error
	over bool
	d    drip.Decision
	span int64 // a calendar window's length at the decision (Item.span)
}

// scratch is a step's memory, pooled: the items and results handed to a
// store through its interface escape, and a decision on the memory store
// should allocate little.
type scratch struct {
	reqs  []stepReq
	items []bucket.Prepared
	res   []bucket.Result
	plans []*Plan // a call's plans (planned)
	own   []Plan  // those compiled for the call: overwritten by the next, they hold no caller's strings
	used  int     // how many items this use of sc has sized: all free clears
}

var scratches = sync.Pool{New: func() any {
	return &scratch{reqs: make([]stepReq, 0, 4), items: make([]bucket.Prepared, 4), res: make([]bucket.Result, 4)}
}}

// sized is sc's items and results, n of each.
func (sc *scratch) sized(n int) ([]bucket.Prepared, []bucket.Result) {
	if cap(sc.items) < n {
		sc.items, sc.res = make([]bucket.Prepared, n), make([]bucket.Result, n)
	}
	sc.used = max(sc.used, n)
	return sc.items[:n], sc.res[:n]
}

// planned is plans, a plan for each of reqs, with each one missing (nil,
// or plans shorter than reqs) compiled into sc for this call: an inline
// limit compiled once, as far as the call needs (compileCall).
func (sc *scratch) planned(reqs []drip.Request, plans []*Plan) []*Plan {
	n := len(reqs)
	if len(plans) >= n && !slices.Contains(plans[:n], nil) {
		return plans[:n]
	}
	if cap(sc.own) < n {
		sc.own = make([]Plan, n)
	}
	sc.plans = sc.plans[:0]
	for i := range reqs {
		var pl *Plan
		if i < len(plans) {
			pl = plans[i]
		}
		if pl == nil {
			pl = &sc.own[i]
			pl.compileCall(&reqs[i].Limit)
		}
		sc.plans = append(sc.plans, pl)
	}
	return sc.plans
}

// free returns sc to the pool, holding no caller's items, strings or
// plans. It clears what this use wrote, not the whole capacity: a batch
// that once grew the arrays would otherwise make every later decision
// clear them all.
func (sc *scratch) free() {
	clear(sc.reqs)
	clear(sc.items[:sc.used])
	clear(sc.plans)
	sc.reqs, sc.plans, sc.used = sc.reqs[:0], sc.plans[:0], 0
	scratches.Put(sc)
}
