package engine

import (
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
// wins over what a token says.
func (e *Engine) LimitOf(rule *rules.Rule, key string, value func(rules.Source) (string, bool)) (l drip.Limit, ok bool) {
	if l, ok := e.ovr.Load().Limit(key); ok {
		return l, true
	}
	if value == nil {
		return rule.Limit, false
	}
	return rule.LimitFor(value)
}
