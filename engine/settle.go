package engine

import (
	"context"
	"errors"
	"slices"
	"time"

	"github.com/driplimit/drip"
	"github.com/driplimit/drip/bucket"
	"github.com/driplimit/drip/rules"
)

// Events of Settle, in the vocabulary of Observer.Decision.
const (
	// Charged: the response cost more than the estimate taken
	// (cost_from_response), and the difference was taken, into debt if
	// need be; or a response whose status matched was counted
	// (count_status).
	Charged Event = "charged"
	// Forgiven: a charge would have run the bucket's debt past its bound
	// (max_reserved, else one burst): what passed it was not charged.
	Forgiven Event = "forgiven"
	// Settled: the response cost what was taken, or its status did not
	// count: nothing changed.
	Settled Event = "settled"
	// Spent, to Observer.Tokens only: what a cost_from_response rule's
	// request cost in the end, as its bucket counts it (the estimate,
	// less what was refunded, plus what was charged).
	Spent Event = "spent"
	// Unreported: the response said nothing of its cost (no usage in its
	// body, no header or trailer: a stream cut short, a server that does
	// not report it): the estimate taken stands.
	Unreported Event = "unreported"
)

// Response is what a front door read of a request's response, for
// Outcome.Settle.
type Response struct {
	// Status is the response's status: an HTTP status (a gRPC door gives
	// its code's HTTP equivalent, 200 for OK, 401 for Unauthenticated,
	// ...). Zero means the request errored and nothing was served (the
	// upstream could not be reached, the handler failed before it wrote
	// anything): the estimates are refunded and nothing is counted.
	Status int
	// Value reads a value of the response (a header or a trailer, as
	// src says), when it has one. Nil: none.
	Value func(src rules.ResponseSource) (string, bool)
}

// Settles reports whether the outcome has rules to settle when the
// response ends (Settle): cost_from_response or count_status rules that
// the request passed. A front door reads the response only then.
func (out *Outcome) Settles() bool {
	if out == nil || !out.Allowed {
		return false
	}
	for i := range out.Applied {
		if out.Applied[i].settles() {
			return true
		}
	}
	return false
}

func (a *Applied) settles() bool { return a.Rule.Settles() && a.Event == Allowed && !a.Local }

// ReadsUsage reports whether a rule to settle reads a model server's
// usage in the response's body (cost_from_response: openai or
// anthropic). The door then reads the body as it goes by.
func (out *Outcome) ReadsUsage() bool {
	if !out.Settles() {
		return false
	}
	for i := range out.Applied {
		if a := &out.Applied[i]; a.settles() && a.Rule.CostFrom != nil && a.Rule.CostFrom.API != "" {
			return true
		}
	}
	return false
}

// debtBound is the most debt a settlement may run a bucket of limit l
// into: its max_reserved when set, else one burst; 0 for a sliding or a
// calendar window, which hold no debt (a charge there takes what the
// window has left, and the rest is forgiven).
func debtBound(l *drip.Limit, pl *Plan) float64 {
	switch {
	case pl.algo.counted:
		return 0
	case l.MaxReserved > 0:
		return l.MaxReserved
	}
	return pl.burst
}

// chargeReq is the request that charges cost of work done to key's bucket
// of limit l: with a reservation, into debt at most debtBound (cost cut to
// the burst plus the bound); a limit without debt is taken plainly. pl
// is l's plan.
func chargeReq(key string, l drip.Limit, pl *Plan, cost float64) drip.Request {
	l.MaxReserved = debtBound(&l, pl)
	return drip.Request{Key: key, Limit: l, Cost: min(cost, pl.burst+l.MaxReserved), Reserve: l.MaxReserved > 0}
}

// Settle settles the rules that know the response, once it has ended,
// however it ended. Call it once, with what the door read of the
// response; further calls do nothing. It goes through the engine
// (breaker, deadline, observer); ctx's cancellation does not end it.
//
// A cost_from_response rule took its estimate before the request was
// served. When the response reports the actual cost, the difference is
// taken or given back (Refunded). A take is a reservation: the work is
// done, so the bucket may go into debt up to a bound. What would pass
// the bound is Forgiven. The actual cost is never below min_cost.
//
// A response without a cost (ParseUsage) leaves the estimate
// (Unreported). But such a response with an error status (400 and up),
// under a rule that reads a model server's usage, costs min_cost: it
// generated nothing. A request that errored (Status 0) took nothing: its
// estimate is refunded.
//
// A count_status rule was only checked before the request. Its cost is
// taken now, as a charge, when Status is in its set.
//
// Charges are one store call and refunds another. A charge the debt
// bound refuses is asked once more at what the bound leaves. A store
// failure changes nothing: the error is returned, the estimates stand.
func (out *Outcome) Settle(ctx context.Context, resp Response) error {
	if !out.Settles() || !out.settled.CompareAndSwap(false, true) {
		return nil
	}
	ctx = context.WithoutCancel(ctx)
	e := out.eng
	var charges, refunds []drip.Request
	var charged, refunded []*Applied
	var plans []*Plan // refunds'
	var asked []float64
	for i := range out.Applied {
		a := &out.Applied[i]
		if !a.settles() {
			continue
		}
		delta := 0.0
		switch {
		case len(a.Rule.CountStatus) > 0:
			if resp.Status != 0 && a.Rule.CountStatus.Has(resp.Status) {
				delta = a.Cost
			}
		case resp.Status == 0:
			delta = -a.Cost
		default:
			c, ok := reported(resp, a.Rule.CostFrom)
			switch {
			case ok:
				delta = max(c, a.Rule.MinCost) - a.Cost
			case a.Rule.CostFrom.API != "" && resp.Status >= 400:
				delta = a.Rule.MinCost - a.Cost
			default:
				e.spent(a, a.Cost) // before the event, which tests wait for
				e.obs.Decision(a.Rule.Name, a.Rule.Mode, Unreported)
				e.log.Info("drip: the response reported no cost; the estimate taken stands",
					"rule", a.Rule.Name, "status", resp.Status, "cost_from_response", a.Rule.CostFrom.String(), "estimate", a.Cost)
				continue
			}
		}
		switch {
		case delta > 0:
			req := chargeReq(a.Key, a.Limit, a.plan(), delta)
			if a.Rule.Budget == rules.Strict {
				// No debt: what the worst case taken did not cover
				// is forgiven, so the limit is never exceeded.
				req.Limit.MaxReserved, req.Reserve = 0, false
				req.Cost = min(delta, a.plan().burst)
			}
			charges = append(charges, req)
			charged, asked = append(charged, a), append(asked, delta)
		case delta < 0:
			refunds = append(refunds, drip.Request{Key: a.Key, Limit: a.Limit, Cost: -delta})
			plans = append(plans, a.plan())
			refunded = append(refunded, a)
		default:
			e.spent(a, a.Cost)
			e.obs.Decision(a.Rule.Name, a.Rule.Mode, Settled)
		}
	}
	var errs []error
	if len(refunds) > 0 {
		_, err := e.applyPlans(ctx, out.rs.timeout, out.rs.breaker, bucket.Refund, refunds, plans)
		if err == nil {
			for i, a := range refunded {
				e.spent(a, a.Cost-refunds[i].Cost)
				e.obs.Decision(a.Rule.Name, a.Rule.Mode, Refunded)
				if refunds[i].Cost > 0 {
					e.obs.Tokens(a.Rule.Name, Refunded, refunds[i].Cost)
				}
			}
		} else {
			for _, a := range refunded {
				e.spent(a, a.Cost) // the estimate stands
			}
		}
		errs = append(errs, err)
	}
	if len(charges) > 0 {
		errs = append(errs, out.charge(ctx, charges, asked, charged))
	}
	return errors.Join(errs...)
}

// reported is the cost a response reports at src, if it does.
func reported(resp Response, src *rules.ResponseSource) (float64, bool) {
	if resp.Value == nil {
		return 0, false
	}
	s, ok := resp.Value(*src)
	if !ok {
		return 0, false
	}
	return ParseUsage(s)
}

// charge takes reqs with a reservation (chargeReqs) and reports each
// (asked: what each would have charged before the cap at the burst plus
// the bound).
func (out *Outcome) charge(ctx context.Context, reqs []drip.Request, asked []float64, as []*Applied) error {
	plans := make([]*Plan, len(as))
	for i, a := range as {
		plans[i] = a.plan()
	}
	_, charged, err := out.eng.chargeReqs(ctx, out.rs.timeout, out.rs.breaker, reqs, plans)
	if err != nil {
		for _, a := range as {
			out.eng.spent(a, a.Cost) // the estimate stands
		}
		return err
	}
	for i, a := range as {
		out.eng.spent(a, a.Cost+charged[i])
		out.eng.charged(a.Rule.Name, a.Rule.Mode, charged[i], asked[i])
	}
	return nil
}

// spent tells the observer what a cost_from_response rule's request
// cost in the end (Spent).
func (e *Engine) spent(a *Applied, tokens float64) {
	if a.Rule.CostFrom == nil || tokens <= 0 {
		return
	}
	e.obs.Tokens(a.Rule.Name, Spent, tokens)
}

// charged reports a charge of asked tokens of which charged were taken:
// the event (Charged, or Forgiven when less was taken) and the tokens
// charged and forgiven.
func (e *Engine) charged(rule string, mode rules.Mode, charged, asked float64) {
	ev := Charged
	if charged < asked {
		ev = Forgiven
	}
	e.obs.Decision(rule, mode, ev)
	if charged > 0 {
		e.obs.Tokens(rule, Charged, charged)
	}
	if charged < asked {
		e.obs.Tokens(rule, Forgiven, asked-charged)
	}
}

// chargeReqs takes reqs with a reservation, all at once: work that was
// done, charged into debt. When the debt bound (each request's
// Limit.MaxReserved) refuses some, it asks once more with each of those
// at what its bound leaves (its tokens plus the bound), and forgives the
// rest: charged[i] is what request i was charged (its cost, less, or 0);
// decs are the bucket's decisions, the last asked of each.
func (e *Engine) chargeReqs(ctx context.Context, timeout time.Duration, br rules.Breaker, reqs []drip.Request, plans []*Plan) (decs []drip.Decision, charged []float64, err error) {
	decs, charged = make([]drip.Decision, len(reqs)), make([]float64, len(reqs))
	idx := make([]int, len(reqs)) // reqs[j] is the request idx[j] of the caller
	for i := range idx {
		idx[i] = i
	}
	reqs = slices.Clone(reqs)
	for try := 0; ; try++ {
		ds, err := e.applyPlans(ctx, timeout, br, bucket.Take, reqs, plans)
		if err != nil {
			return nil, nil, err
		}
		for j, i := range idx {
			decs[i] = ds[j]
		}
		if allAllowed(ds) {
			for j, i := range idx {
				charged[i] = reqs[j].Cost
			}
			return decs, charged, nil
		}
		if try == 1 {
			return decs, charged, nil // all forgiven
		}
		// What the bound leaves each refused charge: the bucket's
		// tokens (a denial reports them) plus the bound, in drip's
		// fixed point, less one micro-token against rounding when
		// there is a bound (a window without debt is taken to 0).
		var keep []drip.Request
		var kept []int
		var keptPlans []*Plan
		for j, r := range reqs {
			if d := ds[j]; !d.Allowed {
				left := toMicro(d.Tokens) + toMicro(r.Limit.MaxReserved)
				if r.Reserve {
					left--
				}
				if left <= 0 {
					continue
				}
				r.Cost = float64(left) / bucket.Micro
			}
			keep, kept, keptPlans = append(keep, r), append(kept, idx[j]), append(keptPlans, plans[j])
		}
		if len(keep) == 0 {
			return decs, charged, nil
		}
		reqs, idx, plans = keep, kept, keptPlans
	}
}
