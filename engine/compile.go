package engine

import (
	"math"
	"sync/atomic"
	"time"

	"github.com/driplimit/drip"
	"github.com/driplimit/drip/bucket"
	"github.com/driplimit/drip/internal/sfv"
	"github.com/driplimit/drip/rules"
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
	quota  int64         // q, RateLimit-Limit (quotaOf)
	name   string        // the rule's name as a structured-field string (sfv.String), in RateLimit
	burst  float64       // Burst
	fill   time.Duration // how long it takes to fill from empty (w)
	algo   algo          // what its algorithm means for the engine
	// perKey: params hold for one key at one time only (a fixed window
	// placed by its key's hash, a calendar window). drip.Apply resolves
	// them at each decision.
	perKey bool
	leased bool // its requests carry the leased mark (drip.Limit.Leased)

	local atomic.Pointer[localPlan] // the local fallback's, made at first need
}

// localPlan is a plan's local fallback: its limit shared by f.
type localPlan struct {
	f     float64
	limit drip.Limit
	plan  *Plan
}

// PlanOf compiles limit l of a rule (or a door's limit) called name.
// A limit that is not valid allows nothing.
func PlanOf(name string, l drip.Limit) *Plan {
	p, err := l.Params("") // its burst does not depend on a key
	pl := &Plan{params: p, algo: algoOf(&l), leased: l.Leased}
	pl.perKey = p.Kind == bucket.Calendar || (p.Kind == bucket.Window && l.Start == 0)
	switch {
	case pl.algo.slots:
		pl.burst = float64(l.MaxInFlight)
	case err == nil:
		pl.burst = float64(p.Burst) / bucket.Micro
	}
	pl.quota = int64(math.Floor(pl.burst))
	if err == nil && !pl.algo.slots { // slots have no window
		pl.fill = p.Until(bucket.State{}, p.Burst, 0)
	}
	pl.policy, pl.name = policyItem(name, pl), sfv.String(name)
	return pl
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
