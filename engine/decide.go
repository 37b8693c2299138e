package engine

import (
	"context"
	"slices"
	"time"

	"github.com/driplimit/drip"
	"github.com/driplimit/drip/bucket"
	"github.com/driplimit/drip/rules"
	"github.com/driplimit/drip/store"
)

// Values is what a front door offers the engine about one request.
type Values interface {
	// Value is the request's value for a limit key (client IP, header,
	// verified claim, path, method, ...); ok is false when it has none,
	// and the rule then does not apply.
	Value(src rules.Source) (value string, ok bool)
	// Identity returns the client identity that seeds a denial's
	// Retry-After jitter, given the denying rule's bucket key. It is, for
	// example, "sub:" and a verified subject, else "ip:" and the address.
	Identity(key string) string
	// Cost is the request's own cost under a rule whose cost_source is a
	// program's function (rules.KindFunc, rules.FuncRule). ok false, or
	// a cost that is negative, not finite or above 1e12, costs the rule's
	// DefaultCost. Values without such rules return 0, false.
	Cost(rule *rules.Rule) (cost float64, ok bool)
}

// Reasons of a denial, in the problem details.
const (
	ReasonTokenBucket      = "token_bucket_exceeded"
	ReasonFixedWindow      = "fixed_window_exceeded"
	ReasonSlidingWindow    = "sliding_window_exceeded"
	ReasonConcurrency      = "concurrency_exceeded"
	ReasonCostExceedsBurst = "cost_exceeds_burst"
	ReasonStoreUnavailable = "store_unavailable"
	// ReasonUnbounded: a strict budget's request does not say the most
	// it can cost (a model server's call without an output maximum): it
	// is refused, and nothing is taken.
	ReasonUnbounded = "unbounded_request"
)

// Decide decides one request under rs. Every rule whose match holds
// applies, in file order; within a group, only the first (tiers). A rule
// whose limit key has no value does not apply. The enforce rules are
// taken all or nothing in one store call. Shadow rules are taken in a
// second call once the request is allowed, else peeked. When the store
// fails, each enforce rule's on_error decides: allow, deny (503) or
// local.
func (e *Engine) Decide(ctx context.Context, rs *Rules, r Values) *Outcome {
	ctx, sp := e.startDecide(ctx) // trace.go
	out := &Outcome{Allowed: true, eng: e, rs: rs}
	all := out.first[:0] // the rules that apply: enforce rules first, each in file order
	ne := 0              // how many enforce rules
	ad := 0              // how many adaptive rules
	var groups []string
	for i := range rs.Set.Rules {
		rule := &rs.Set.Rules[i]
		if rule.Group != "" && slices.Contains(groups, rule.Group) {
			continue
		}
		if !rule.Matches(r.Value) {
			continue
		}
		vals, ok := rule.KeyValues(r.Value)
		if !ok {
			continue
		}
		if rule.Group != "" {
			groups = append(groups, rule.Group)
		}
		c, bounded := cost(r, rule)
		if !bounded && rule.Budget == rules.Strict && rule.Mode != rules.Shadow {
			why := "it does not say the most it can cost"
			if b, ok := r.(Bounder); ok {
				why = b.Unbounded(rule)
			}
			out = Refuse(ReasonUnbounded, "rule \""+rule.Name+"\" is a strict budget and this request cannot be bounded: "+why)
			out.Top = &Applied{Rule: rule} // the rule that refused it, not decided
			e.endDecide(sp, out)
			return out
		}
		// Built in place: an Applied is over 400 bytes, and a copy of it
		// is a typed move with write barriers while the GC runs.
		all = slices.Grow(all, 1)[:len(all)+1]
		a := &all[len(all)-1]
		*a = Applied{Rule: rule, Item: Item{Key: rule.Key(vals), Cost: c, Limit: rule.Limit,
			Wait: rule.MaxWait, Queue: rule.Name, MaxQueue: rule.MaxQueue, Plan: rs.plans[i]}}
		class := classOf(r, rule)
		a.SetClass(class, rule.Share(class))
		if len(rule.CountStatus) > 0 {
			a.Mode = Check
		}
		if rule.Adaptive != nil {
			ad++ // learned in this engine, never in the store (adaptive.go)
		} else if rule.Claims != nil || e.ovr.Load().Len() > 0 { // else the rule's own, without copying it twice
			if l, ok := e.LimitOf(rule, a.Key, r.Value); ok { // overrides.go
				a.Limit, a.Plan = l, PlanOf(rule.Name, l)
			}
		}
		if a.Plan.algo.slots && rule.Adaptive == nil {
			a.Lease = store.NewLeaseID()
		}
		if rule.Mode != rules.Shadow {
			// Before the shadow rules found so far, in one backing array
			// for both (the rules' outcome, decided in place).
			last := len(all) - 1
			if last > ne {
				t := *a
				copy(all[ne+1:], all[ne:last])
				all[ne] = t
			}
			ne++
		}
	}
	if len(all) > 0 {
		out.Applied = all
	}
	if ad > 0 {
		e.enforceAdaptive(ctx, rs, out, all[:ne]) // adaptive.go
	} else {
		e.enforce(ctx, rs, out, all[:ne], false)
	}
	e.shadow(ctx, rs, out, all[ne:])
	for i := range out.Applied {
		a := &out.Applied[i]
		e.obs.Decision(a.Rule.Name, a.Rule.Mode, a.Event)
		if e.keys != nil {
			e.keys.Key(a.Rule.Name, a.Rule.Mode, a.Event, &a.Item)
		}
	}
	out.pick(r, rs.Set.RetryJitter)
	e.nameClass(out) // adaptive.go
	e.endDecide(sp, out)
	return out
}

// Bounder is Values that says why a request has no bound (a cost source
// of kind rules.KindBound that it could not read), for the refusal of a
// strict budget.
type Bounder interface {
	Unbounded(rule *rules.Rule) string
}

// cost is the request's cost under rule, at least its MinCost; read
// false when its source had no cost to read and DefaultCost stood in.
func cost(r Values, rule *rules.Rule) (c float64, read bool) {
	c, read = rawCost(r, rule)
	return max(c, rule.MinCost), read
}

func rawCost(r Values, rule *rules.Rule) (float64, bool) {
	switch rule.CostSource.Kind {
	case rules.KindFixed:
		return rule.FixedCost, true
	case rules.KindFunc:
		// NaN fails both comparisons.
		if x, ok := r.Cost(rule); ok && x >= 0 && x <= maxCost {
			return x, true
		}
		return rule.DefaultCost, false
	}
	if s, ok := r.Value(rule.CostSource); ok {
		if c, ok := ParseCost(s); ok {
			return c, true
		}
	}
	return rule.DefaultCost, false
}

// enforce takes the enforce rules enf all or nothing (blocked: another
// rule, an adaptive one, already denied the request: they are peeked).
func (e *Engine) enforce(ctx context.Context, rs *Rules, out *Outcome, enf []Applied, blocked bool) {
	if len(enf) == 0 {
		return
	}
	// Rules' keys are distinct (they begin with the rule's name): one
	// store request per rule, in order.
	its := stepItems(enf, false)
	over := -1
	for i, it := range its {
		if it.Never() {
			over = i
			break
		}
	}
	if blocked {
		blocked := blockedItem // adaptive.go
		its = append(its, &blocked)
	}
	// A cost above the burst can never be allowed: the request is denied
	// without taking anything, and the buckets are peeked at (cost 0)
	// for the headers.
	allowed, err := e.takeWaiting(ctx, rs.timeout, rs.breaker, its, true) // queue.go
	if over >= 0 {
		out.deny(ReasonCostExceedsBurst)
		for i := range enf {
			enf[i].Event = NotTaken // and Decided, unless the peek failed
		}
		a := &enf[over]
		a.Event, a.Reason = Denied, ReasonCostExceedsBurst
		a.Decision.Allowed = false
		return
	}
	if err != nil {
		out.Err = err
		if ctx.Err() != nil {
			// The caller left (it cancelled, or its deadline passed)
			// while the store was asked: no one waits for an answer, so
			// on_error does not apply. A denial, whatever the store did.
			out.deny("")
			for i := range enf {
				enf[i].Event = NotTaken
			}
			return
		}
		e.fail(ctx, out, enf)
		return
	}
	var shed *Applied
	if allowed {
		if shed = shedPriority(enf); shed != nil { // adaptive.go
			e.giveBack(ctx, rs.timeout, rs.breaker, its)
			for _, it := range its {
				it.Decision.Allowed = true // given back: each shows its bucket as it is
			}
			allowed = false
		}
	}
	settle(out, enf, allowed, false, func(i int) drip.Decision { return its[i].Decision })
	if shed != nil {
		e.shedBy(out, shed, ReasonShed)
	}
}

// stepItems are the items of the rules as, for DecideItems' steps
// (shadow: as Shadow items, but for Check ones), with their compiled
// params.
func stepItems(as []Applied, shadow bool) []*Item {
	its := make([]*Item, len(as))
	for i := range as {
		a := &as[i]
		if shadow && a.Mode != Check {
			a.Mode = Shadow
		}
		its[i] = &a.Item
	}
	return its
}

// settle records a multi-take's decisions (decision(i) of enf[i]) in enf
// and out. A rule its own bucket allowed but that was not taken (another
// denied) shows its bucket as it is, before the take (beforeTake).
func settle(out *Outcome, enf []Applied, taken, local bool, decision func(i int) drip.Decision) {
	allowed, denied := Allowed, Denied
	if local {
		allowed, denied = LocalAllowed, LocalDenied
	}
	for i := range enf {
		a := &enf[i]
		a.Decision, a.Decided, a.Local = decision(i), true, local
		switch {
		case !a.Decision.Allowed:
			a.Event, a.Reason = denied, a.plan().algo.reason
		case taken:
			a.Event = allowed
			a.held = a.Lease != ""
		default:
			a.Event = NotTaken
			a.Decision = beforeTake(a.Decision, a.plan(), a.Key, a.Cost)
		}
	}
	if !taken {
		out.deny("")
	}
}

// fail applies the rules' fail policies after the store failed.
func (e *Engine) fail(ctx context.Context, out *Outcome, enf []Applied) {
	for i := range enf {
		if enf[i].Rule.OnError == rules.Deny {
			out.deny(ReasonStoreUnavailable)
			// The breaker probes the store again within its cool-down:
			// a second is soon enough to ask again.
			out.RetryAfter = 1
			for j := range enf {
				enf[j].Event = NotTaken
			}
			enf[i].Event, enf[i].Reason = ErrorDenied, ReasonStoreUnavailable
			return
		}
	}
	var idx []int
	local := e.localStore() // nil without WithLocal: local allows
	for i := range enf {
		if enf[i].Rule.OnError == rules.Local && local != nil {
			idx = append(idx, i)
		} else {
			enf[i].Event = ErrorAllowed
		}
	}
	if len(idx) == 0 {
		return
	}
	loc := make([]Applied, len(idx))
	lreqs := make([]drip.Request, len(idx))
	plans := make([]*Plan, len(idx))
	for j, i := range idx {
		a := enf[i]
		a.Limit, a.Plan = a.plan().localOf(a.Rule.Name, a.Limit, a.Rule.LocalShare)
		a.never = unknown // a new limit: its own verdict
		loc[j] = a
		lreqs[j], plans[j] = drip.Request{Key: a.Key, Limit: a.Limit, Cost: a.Cost, Lease: a.Lease}, a.Plan
	}
	for j := range loc {
		if loc[j].Never() {
			out.deny(ReasonCostExceedsBurst)
			for k := range loc {
				loc[k].Event, loc[k].Local = NotTaken, true
			}
			loc[j].Event, loc[j].Reason = LocalDenied, ReasonCostExceedsBurst
			copyBack(enf, idx, loc)
			return
		}
	}
	ds, err := applyPlansOn(ctx, local, bucket.Take, e.at(), lreqs, plans)
	if err != nil { // cannot happen with validated rules; fail open
		e.logError("local fallback", err)
		for j := range loc {
			loc[j].Event = ErrorAllowed
		}
		copyBack(enf, idx, loc)
		return
	}
	settle(out, loc, allAllowed(ds), true, func(i int) drip.Decision { return ds[i] })
	copyBack(enf, idx, loc)
}

func copyBack(enf []Applied, idx []int, loc []Applied) {
	for j, i := range idx {
		enf[i] = loc[j]
	}
}

func (e *Engine) shadow(ctx context.Context, rs *Rules, out *Outcome, sh []Applied) {
	if len(sh) == 0 {
		return
	}
	its := stepItems(sh, true)
	asked := false // a shadow rule goes to the store
	for i, it := range its {
		if it.Never() {
			sh[i].Event, sh[i].Reason = Denied, ReasonCostExceedsBurst
		} else {
			asked = true
		}
	}
	if !asked {
		return
	}
	if out.Err != nil { // the store just failed: spare the request a second deadline
		for i, it := range its {
			if !it.Never() {
				sh[i].Event = ErrorAllowed
			}
		}
		return
	}
	e.shadowItems(ctx, rs.timeout, rs.breaker, its, !out.Allowed)
	for i, it := range its {
		a := &sh[i]
		switch {
		case it.Never():
		case it.Failed:
			a.Event = ErrorAllowed
		case !it.Decision.Allowed:
			a.Event, a.Reason = Denied, a.plan().algo.reason
		case out.Allowed && !it.Changed:
			a.Event = NotTaken
		default:
			a.Event = Allowed
			a.held = out.Allowed && a.Lease != ""
		}
	}
}

// ReasonOf is the reason of a denial by a bucket of limit l
// (ReasonTokenBucket, ReasonFixedWindow, ...).
func ReasonOf(l drip.Limit) string { return algoOf(&l).reason }

// Burst is l's burst, as drip's fixed point holds it (Limit.Params: its
// rate when it has none); for a concurrency limit, its slots
// (max_in_flight); 0 for a limit that allows nothing (Envoy's
// requests_per_unit 0).
//
// Deprecated: use Item.Burst, which reads the compiled plan.
func Burst(l drip.Limit) float64 {
	if algoOf(&l).slots {
		return float64(l.MaxInFlight)
	}
	p, err := l.Params("")
	if err != nil {
		return 0
	}
	return float64(p.Burst) / bucket.Micro
}

// share is the local fallback's limit: share of the rate and the burst,
// with a burst of at least one token (or the whole burst, if smaller) so
// that a small bucket's fallback still admits requests of cost 1.
func share(l drip.Limit, p *Plan, f float64) drip.Limit {
	if f <= 0 || f > 1 {
		f = rules.DefaultLocalShare
	}
	if p.algo.slots {
		// At least one slot, so that the fallback admits requests.
		l.MaxInFlight = max(1, int(float64(l.MaxInFlight)*f))
		return l
	}
	b := p.burst
	l.Burst = max(b*f, min(b, 1))
	l.Rate *= f
	if p.algo.counted {
		l.Rate, l.Burst = l.Burst, 0 // the limit is the rate: its burst follows
	}
	return l
}

// beforeTake turns the decision of a take that its own bucket allowed but
// that was not applied (another request of the multi-take was denied)
// into the bucket as it is: a multi-take reports the tokens each request
// would have left, but headers and statuses must show what is left. It
// works in drip's fixed point: the cost as drip rounds it is added back
// to the micro-tokens, and the time to fill is shortened by the time those
// micro-tokens take to refill (whole periods on a grid), as drip's math
// computes both, under the plan pl of the item's limit.
func beforeTake(d drip.Decision, pl *Plan, key string, cost float64) drip.Decision {
	if pl.algo.slots {
		// The slot the take would have held is free; the leases held and
		// so when they expire are as they were.
		d.Tokens++
		d.Remaining++
		return d
	}
	p := pl.paramsAt(key, time.Time{}) // a limit not valid allows nothing: no cost
	c, err := store.Cost(bucket.Take, cost, false, p)
	if err != nil || c == 0 {
		return d
	}
	after := toMicro(d.Tokens)
	before := after + c
	d.Tokens = float64(before) / bucket.Micro
	d.Remaining = max(0, before) / bucket.Micro
	// The time to fill from a number of micro-tokens does not depend on
	// the bucket's timestamp: measure both from 0.
	fill := func(x int64) time.Duration { return p.Until(bucket.State{Tokens: x}, p.Burst, 0) }
	d.ResetAfter = max(0, d.ResetAfter-(fill(after)-fill(before)))
	return d
}

// toMicro is x tokens in micro-tokens, as drip's decisions were computed
// (a decision's Tokens is a whole number of micro-tokens).
func toMicro(x float64) int64 {
	if x < 0 {
		return -int64(-x*bucket.Micro + 0.5)
	}
	return int64(x*bucket.Micro + 0.5)
}
