package engine

import (
	"context"

	"github.com/driplimit/drip"
	"github.com/driplimit/drip/bucket"
	"github.com/driplimit/drip/store"
)

// Prepared is requests checked and prepared once, each by its plan.
// The decision API decides them in parts: shadow rules after the
// others, requests that may wait in the queue. Make it with
// Engine.Prepare; decide each part with Apply.
type Prepared struct {
	e     *Engine
	reqs  []drip.Request
	plans []*Plan
	items []bucket.Prepared
	// one holds a single request's, in the one allocation.
	one struct {
		req  [1]drip.Request
		plan [1]*Plan
		own  [1]Plan
		item [1]bucket.Prepared
	}
}

// Prepare checks reqs for op as Apply does, with the same errors. It
// prepares each by plans[i] (nil: compiled now, once). An error names
// its request when multi, or when there are several. No store is asked.
func (e *Engine) Prepare(op bucket.Op, reqs []drip.Request, plans []*Plan, multi bool) (*Prepared, error) {
	n := len(reqs)
	p := &Prepared{e: e}
	var own []Plan
	if n == 1 {
		p.reqs, p.plans, own, p.items = p.one.req[:], p.one.plan[:], p.one.own[:], p.one.item[:]
	} else {
		p.reqs, p.plans, p.items = make([]drip.Request, n), make([]*Plan, n), make([]bucket.Prepared, n)
	}
	copy(p.reqs, reqs)
	for i := range reqs {
		if i < len(plans) && plans[i] != nil {
			p.plans[i] = plans[i]
			continue
		}
		if own == nil {
			own = make([]Plan, n)
		}
		p.plans[i] = &own[i]
		own[i].compile(&p.reqs[i].Limit)
	}
	if err := preparePlans(op, e.at(), p.reqs, p.plans, p.items, multi || n > 1); err != nil {
		return nil, err
	}
	return p, nil
}

// Plan is the plan of request i.
func (p *Prepared) Plan(i int) *Plan { return p.plans[i] }

// Request is request i, as Prepare was given it (a copy).
func (p *Prepared) Request(i int) *drip.Request { return &p.reqs[i] }

// Apply decides the requests at idx (nil: all) in one store call, as
// Engine.Apply does. Their items are those Prepare made; a calendar
// window is placed again at the call's time. op is Prepare's op, or
// Peek for requests prepared for a take.
func (p *Prepared) Apply(ctx context.Context, op bucket.Op, idx []int) (drip.Multi, error) {
	n := len(idx)
	if idx == nil {
		n = len(p.reqs)
	}
	if n == 0 {
		return drip.Multi{}, store.ErrNoRequests
	}
	at := func(j int) int {
		if idx == nil {
			return j
		}
		return idx[j]
	}
	e, now := p.e, p.e.at()
	sc := scratches.Get().(*scratch)
	defer sc.free()
	items, res := sc.sized(n)
	for j := range n {
		i := at(j)
		items[j] = p.items[i]
		if pl := p.plans[i]; pl.dated {
			q := pl.paramsAt(p.reqs[i].Key, now)
			items[j].Params.Start, items[j].Params.Period = q.Start, q.Period
		}
	}
	if err := e.call(ctx, e.timeout, defaultBreaker, op, now, items, res); err != nil {
		return drip.Multi{}, err
	}
	ds := make([]drip.Decision, n)
	for j := range n {
		i := at(j)
		p.plans[i].hints(&res[j], &items[j].Params, now)
		ds[j] = drip.DecisionOf(res[j], items[j].Params.Burst)
		if op == bucket.Refund && p.reqs[i].Lease != "" {
			e.queues.released(p.reqs[i].Key) // freed
		}
	}
	return multiOf(ds), nil
}
