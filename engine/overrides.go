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

// LimitOf is the limit of rule's bucket key for a request whose values
// value reads (nil: a request without values, such as the decision
// API's): the key's override, else the limit the rule's limit_from_claims
// reads from verified claims, else the rule's own; ok is false for the
// rule's own. An override is the operator's word on one bucket, so it
// wins over what a token says; but an override of another algorithm than
// the rule's (set before the rule's algorithm changed) is stale and never
// applies (see Stale). An override keeps its rule's Leased mark: whether
// a rule is leased is the rules file's to say, for every key alike.
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
// it can: an override keeps its rule's algorithm (the admin API refuses
// another), so one of another algorithm was set before the rule changed,
// and applying it would decide a bucket by the wrong kind of limit (a
// token bucket where slots are held under leases, or the reverse).
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
