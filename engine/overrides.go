package engine

import (
	"fmt"

	"github.com/driplimit/drip"
	"github.com/driplimit/drip/override"
	"github.com/driplimit/drip/rules"
)

// SetOverrides makes s the per-tenant overrides of every decision from
// now on (an override.Follower's OnChange calls it). Decisions in flight
// finish with the overrides they started with; nil means none.
func (e *Engine) SetOverrides(s *override.Snapshot) { e.ovr.Store(s) }

// Overrides are the overrides in force.
func (e *Engine) Overrides() *override.Snapshot { return e.ovr.Load() }

// LimitOf returns the limit of rule's bucket key. value reads the
// request's values; nil means none, as in the decision API. The limit is
// the key's override, else the one limit_from_claims reads from verified
// claims, else the rule's own; ok is false for the rule's own.
//
// An override is the operator's word on one bucket: it wins over a
// token's claims. A stale override never applies (Stale). An override
// keeps its rule's Leased mark: the rules file says what is leased.
func (e *Engine) LimitOf(rule *rules.Rule, key string, value func(rules.Source) (string, bool)) (l drip.Limit, ok bool) {
	if l, ok := e.ovr.Load().Limit(key); ok && Stale(rule, l) == "" {
		l.Leased = rule.Limit.Leased
		return l, true
	}
	if value == nil {
		return rule.Limit, false
	}
	return rule.LimitFor(value)
}

// Stale says why an override's limit l cannot apply to rule, or "" when
// it can. An override keeps its rule's algorithm; the admin API refuses
// another. One of another algorithm predates a change of the rule.
// Applying it would decide a bucket by the wrong kind of limit.
func Stale(rule *rules.Rule, l drip.Limit) string {
	if have, want := algorithm(l.Algorithm), algorithm(rule.Limit.Algorithm); have != want {
		return fmt.Sprintf("the override is a %s limit, rule %q is now %s: the rule's own limit applies until the override is replaced or deleted", have, rule.Name, want)
	}
	return ""
}

// algorithm names a's algorithm, the zero value's too.
func algorithm(a drip.Algorithm) drip.Algorithm {
	if a == "" {
		return drip.TokenBucket
	}
	return a
}
