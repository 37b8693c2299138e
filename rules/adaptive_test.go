package rules_test

import (
	"strings"
	"testing"
	"time"

	"github.com/driplimit/drip/rules"
)

// TestAdaptiveRule: an adaptive rule needs no algorithm_config; its
// knobs are bounded (lease_ttl, the decision API's leases, as a
// concurrency rule's); priorities are read and checked.
func TestAdaptiveRule(t *testing.T) {
	set, err := rules.Parse([]byte(`{"rules": [
	  {"name": "a", "limit_keys": ["global"], "algorithm": "adaptive"},
	  {"name": "b", "limit_keys": ["global"], "algorithm": "adaptive", "priority": "batch", "priority_from": "header:x-priority",
	   "algorithm_config": {"initial_limit": 5, "min_limit": 2, "max_limit": 50, "tolerance": 0.1, "smoothing": 1, "window": "50ms", "drop_status": ["5xx", 429], "lease_ttl": "2m"}},
	  {"name": "c", "limit_keys": ["global"], "reserve": "20%", "algorithm_config": {"rps": 10}}]}`), "rules.json")
	if err != nil {
		t.Fatal(err)
	}
	a, b, c := set.Rules[0], set.Rules[1], set.Rules[2]
	if a.Adaptive == nil || a.Adaptive.InitialLimit != rules.DefaultInitialLimit || a.Adaptive.MaxLimit != rules.DefaultMaxLimit || a.Limit.MaxInFlight != rules.DefaultMaxLimit || a.Prioritized() ||
		a.Adaptive.LeaseTTL != 30*time.Second || a.Limit.LeaseTTL != 30*time.Second {
		t.Errorf("defaults: %+v %+v", a.Adaptive, a.Limit)
	}
	if x := b.Adaptive; x.InitialLimit != 5 || x.MinLimit != 2 || x.MaxLimit != 50 || x.Tolerance != 0.1 || x.Smoothing != 1 || x.Window != 50*time.Millisecond || !x.Drops(500) || !x.Drops(429) || x.Drops(404) ||
		x.LeaseTTL != 2*time.Minute || b.Limit.LeaseTTL != 2*time.Minute {
		t.Errorf("knobs: %+v (limit %+v)", x, b.Limit)
	}
	if b.Class() != rules.PriorityBatch || b.Reserve != rules.DefaultReserve || b.PriorityFrom == nil {
		t.Errorf("priorities: class %d reserve %v from %v", b.Class(), b.Reserve, b.PriorityFrom)
	}
	if c.Reserve != 0.2 || c.Class() != rules.PriorityDefault || c.Share(rules.PriorityBatch) != 0.6 || c.Share(rules.PriorityCritical) != 1 {
		t.Errorf("reserve: %v, shares %v %v", c.Reserve, c.Share(rules.PriorityBatch), c.Share(rules.PriorityCritical))
	}
	for _, bad := range []struct{ rule, want string }{
		{`"algorithm": "adaptive", "algorithm_config": {"min_limit": 10, "max_limit": 5}`, "min_limit: must be <= max_limit"},
		{`"algorithm": "adaptive", "algorithm_config": {"initial_limit": 0}`, "initial_limit: must be a whole number"},
		{`"algorithm": "adaptive", "algorithm_config": {"tolerance": 0}`, "tolerance: must be from 0.01 to 10"},
		{`"algorithm": "adaptive", "algorithm_config": {"window": "1h"}`, "window: must be from 1ms to 1m"},
		{`"algorithm": "adaptive", "algorithm_config": {"lease_ttl": "0s"}`, "lease_ttl: must be > 0"},
		{`"algorithm": "adaptive", "algorithm_config": {"lease_ttl": "25h"}`, "lease_ttl: must be at most 24h"},
		{`"algorithm": "adaptive", "algorithm_config": {"max_in_flight": 3}`, "max_in_flight"},
		{`"algorithm": "adaptive", "on_error": "deny"`, "on_error: does not apply to an adaptive rule"},
		{`"algorithm": "adaptive", "mode": "shadow"`, "mode: an adaptive rule is enforced"},
		{`"algorithm": "adaptive", "leased": true`, "leased"},
		{`"algorithm_config": {"rps": 1}, "priority": "urgent"`, "priority: must be critical, default, sheddable, batch"},
		{`"algorithm_config": {"rps": 1}, "priority": 101`, "priority: must be"},
		{`"algorithm_config": {"rps": 1}, "reserve": "60%"`, "reserve: must be a share from 0 to 0.5"},
		{`"algorithm_config": {"rps": 1}, "priority_from": "path"`, "priority_from: must be header:"},
	} {
		_, err := rules.Parse([]byte(`{"rules": [{"name": "x", "limit_keys": ["global"], `+bad.rule+`}]}`), "rules.json")
		if err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("%s: %v, want %q", bad.rule, err, bad.want)
		}
	}
	for _, v := range []struct {
		in   string
		want int
		ok   bool
	}{{"critical", 100, true}, {"Batch", 0, true}, {" 42 ", 42, true}, {"-1", 50, false}, {"101", 50, false}, {"x", 50, false}, {strings.Repeat("1", 17), 50, false}} {
		if p, ok := rules.ParsePriority(v.in); p != v.want || ok != v.ok {
			t.Errorf("ParsePriority(%q) = %d, %v; want %d, %v", v.in, p, ok, v.want, v.ok)
		}
	}
}
