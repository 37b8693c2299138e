package engine

import (
	"math"
	"sync/atomic"
	"time"

	"github.com/driplimit/drip"
	"github.com/driplimit/drip/bucket"
	"github.com/driplimit/drip/internal/calendar"
	"github.com/driplimit/drip/internal/sfv"
	"github.com/driplimit/drip/rules"
	"github.com/driplimit/drip/store"
)

// Rules is a rules Set ready for Decide: build it with Engine.Compile
// whenever the rules change, and hold it as an immutable snapshot.
type Rules struct {
	Set     *rules.Set
	timeout time.Duration
	breaker rules.Breaker
	plans   []*Plan // per rule, compiled once
}

// Plan is a limit compiled once: what every decision under it needs,
// and what its rendering needs. Rules compile theirs in Engine.Compile.
// A door that matches its own limits compiles each when it loads
// (PlanOf). An override's limit is compiled when a request meets it.
type Plan struct {
	params bucket.Params // the limit in fixed point; zero when it allows nothing
	policy string        // its RateLimit-Policy item: `"name";q=20;w=2`
	quota  int64         // q, RateLimit-Limit: the burst rounded down, which never promises more than the limit holds
	name   string        // the rule's name as a structured-field string (sfv.String), in RateLimit
	burst  float64       // Burst
	fill   time.Duration // how long it takes to fill from empty (w)
	algo   algo          // what its algorithm means for the engine
	// keyed: a fixed window without Start, whose grid its key's hash
	// places; dated: a calendar window (cal), placed by the decision's
	// time. paramsAt resolves both at each decision.
	keyed  bool
	dated  bool
	cal    calendar.Period
	leased bool  // its requests carry the leased mark (drip.Limit.Leased)
	err    error // what is wrong with the limit (drip.Limit.Validate): its requests are refused with it

	local atomic.Pointer[localPlan] // the local fallback's, made at first need
}

// localPlan is a plan's local fallback: its limit shared by f.
type localPlan struct {
	f     float64
	limit drip.Limit
	plan  *Plan
}

// PlanOf compiles limit l of a rule (or a door's limit) called name.
// A limit that is not valid allows nothing, and a request of it is
// refused with what is wrong with it.
func PlanOf(name string, l drip.Limit) *Plan {
	pl := new(Plan)
	pl.compile(&l)
	pl.policy, pl.name = policyItem(name, pl), sfv.String(name)
	return pl
}

// compile makes p the plan of l, but for its rendering (policy, name).
// The local fallback's plan stays unmade.
func (p *Plan) compile(l *drip.Limit) {
	p.compileCall(l)
	p.algo = algoOf(l)
	switch {
	case p.algo.slots:
		p.burst = float64(l.MaxInFlight)
	case p.err == nil:
		p.burst = float64(p.params.Burst) / bucket.Micro
	}
	// The headers' quota is a whole number: the burst rounded down, which
	// never promises more than the limit holds.
	p.quota = int64(math.Floor(p.burst))
	if p.err == nil && !p.algo.slots { // slots have no window
		p.fill = p.params.Until(bucket.State{}, p.params.Burst, 0)
	}
}

// compileCall makes p the plan of l as far as one store call needs it
// (prepare, hints): its params, where its window is placed, its leased
// mark, and what is wrong with it. Engine.Apply compiles an inline
// limit so.
func (p *Plan) compileCall(l *drip.Limit) {
	q, err := l.Params("") // its burst does not depend on a key
	*p = Plan{params: q, leased: l.Leased, err: err}
	switch q.Kind {
	case bucket.Calendar:
		u, _ := calendar.ParseUnit(l.Calendar) // valid
		p.dated, p.cal = true, calendar.Period{Unit: u, Loc: l.Location}
	case bucket.Window:
		p.keyed = l.Start == 0
	}
}

// paramsAt is the plan's params for a decision on key at at (zero: now):
// the one resolver of windows placed by their key or by the time, as
// drip.Limit.Params places them.
func (p *Plan) paramsAt(key string, at time.Time) bucket.Params {
	q := p.params
	switch {
	case p.keyed:
		q.Start = int64(store.WindowStart(key, time.Duration(q.Period))) % q.Period
	case p.dated:
		if at.IsZero() {
			at = time.Now()
		}
		q.Start, q.Period = p.cal.Span(at)
	}
	return q
}

// prepare is store.PrepareCost of a request under the plan at at, the
// cost in fixed point already (c, or what is wrong with it: err): its
// params placed for key and at, its leased mark the plan's.
func (p *Plan) prepare(it *bucket.Prepared, op bucket.Op, key string, at time.Time, c int64, err error, reserve bool, lease string) error {
	q := &p.params
	if p.keyed || p.dated {
		pk := p.paramsAt(key, at)
		q = &pk
	}
	if err := store.PrepareCost(it, op, key, q, c, err, reserve, lease); err != nil {
		return err
	}
	it.Leased = p.leased
	return nil
}

// hints puts the waits of r, decided under q (paramsAt's) at at, on a
// calendar window's calendar.
func (p *Plan) hints(r *bucket.Result, q *bucket.Params, at time.Time) {
	if !p.dated {
		return
	}
	if at.IsZero() {
		at = time.Now()
	}
	p.cal.Hints(q.Start, q.Period, at, &r.RetryAfter, &r.ResetAfter)
}

// localOf is the plan of l's local fallback (share), made once.
func (p *Plan) localOf(name string, l drip.Limit, f float64) (drip.Limit, *Plan) {
	if lp := p.local.Load(); lp != nil && lp.f == f {
		return lp.limit, lp.plan
	}
	sl := share(l, p, f)
	lp := &localPlan{f: f, limit: sl, plan: PlanOf(name, sl)}
	p.local.Store(lp)
	return lp.limit, lp.plan
}

// Compile prepares set (nil: rules.Default()) for Decide.
func (e *Engine) Compile(set *rules.Set) *Rules {
	if set == nil {
		set = rules.Default()
	}
	rs := &Rules{Set: set, timeout: e.timeout, breaker: set.Breaker}
	if set.StoreTimeout > 0 {
		rs.timeout = set.StoreTimeout
	}
	rs.breaker = rs.breaker.Or(rules.DefaultBreaker)
	e.pruneAdaptive(set) // adaptive.go: the learned limits of rules gone
	rs.plans = make([]*Plan, len(set.Rules))
	for i := range set.Rules {
		rs.plans[i] = PlanOf(set.Rules[i].Name, set.Rules[i].Limit)
	}
	return rs
}

// Timeout is the deadline of each store call under rs.
func (rs *Rules) Timeout() time.Duration { return rs.timeout }
