package engine

import (
	"time"

	"github.com/driplimit/drip"
	"github.com/driplimit/drip/bucket"
	"github.com/driplimit/drip/rules"
)

// Rules is a rules Set ready for Decide: build it with Engine.Compile
// whenever the rules change, and hold it as an immutable snapshot.
type Rules struct {
	Set     *rules.Set
	timeout time.Duration
	breaker rules.Breaker
	plans   []plan // per rule, compiled once
}

// plan is a limit compiled once, when its rules are (or, for a limit an
// override or a token's claims set, when a request meets it): what every
// decision under it needs, so that the hot path only executes it.
type plan struct {
	params bucket.Params // the limit in drip's fixed point (Limit.Params); zero when the limit allows nothing
	policy string        // its RateLimit-Policy item: `"name";q=20;w=2`
	quota  int64         // q, RateLimit-Limit (Quota)
}

// compile is the plan of limit l of a rule called name.
func compile(name string, l drip.Limit) *plan {
	p, _ := l.Params("") // a rule's limit is valid; its burst does not depend on a key
	return &plan{params: p, policy: PolicyItem(name, l), quota: Quota(l)}
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
	rs.plans = make([]plan, len(set.Rules))
	for i := range set.Rules {
		rs.plans[i] = *compile(set.Rules[i].Name, set.Rules[i].Limit)
	}
	return rs
}

// Timeout is the deadline of each store call under rs.
func (rs *Rules) Timeout() time.Duration { return rs.timeout }
