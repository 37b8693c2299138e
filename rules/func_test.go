package rules

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/driplimit/drip"
)

// TestFuncRule: a FuncRule's Set holds one enforce rule keyed by a
// program's value, with a rules file's defaults; a file cannot name that
// source.
func TestFuncRule(t *testing.T) {
	set, err := FuncRule{Name: "per-user", Limit: drip.PerMinute(10)}.Set()
	if err != nil {
		t.Fatal(err)
	}
	// The same rule read from a file, but for its key source.
	file, err := Parse([]byte(`{"rules": [{"name": "per-user", "limit_keys": ["header:x-user"],
		"algorithm_config": {"rate": 10, "period": "1m"}}]}`), "rules.json")
	if err != nil {
		t.Fatal(err)
	}
	r, f := set.Rules[0], file.Rules[0]
	if len(r.LimitKeys) != 1 || r.LimitKeys[0].Kind != KindFunc || r.Mode != Enforce || r.OnError != Allow ||
		r.LocalShare != DefaultLocalShare || r.CostSource.Kind != KindFixed || r.FixedCost != 1 || r.DefaultCost != 1 {
		t.Errorf("rule %+v", r)
	}
	if set.Breaker != file.Breaker || set.RetryJitter != DefaultJitter || set.StoreTimeout != 0 || set.OnError != Allow {
		t.Errorf("set %+v", set)
	}
	if got, want := r.Key([]string{"a|b"}), f.Key([]string{"a|b"}); got != want || got != `per-user|a\|b` {
		t.Errorf("key %q, a file's rule's %q", got, want)
	}
	if got, ok := set.Rule("per-user"); !ok || got != &set.Rules[0] {
		t.Errorf("Rule: %v %v", got, ok)
	}
	withCost, err := FuncRule{Name: "c", Limit: drip.PerSecond(1).WithBurst(0.5), Cost: true, OnError: Local, LocalShare: 0.25}.Set()
	if err != nil {
		t.Fatal(err)
	}
	if c := withCost.Rules[0]; c.CostSource.Kind != KindFunc || c.DefaultCost != 1 || c.OnError != Local || c.LocalShare != 0.25 {
		t.Errorf("rule %+v", c)
	}
	if _, err := ParseSource("func"); err == nil {
		t.Error(`"func" is a source a rules file can name`)
	}
	if _, err := Parse([]byte(`{"rules": [{"name": "x", "limit_keys": ["func"], "algorithm_config": {"rps": 1}}]}`), "rules.json"); err == nil {
		t.Error(`a rules file keyed by "func" loads`)
	}
}

func TestFuncRuleInvalid(t *testing.T) {
	_, err := FuncRule{Name: "", Limit: drip.Limit{Rate: 1, Period: -time.Second}, OnError: "retry", LocalShare: 2}.Set()
	var e *Error
	if !errors.As(err, &e) || len(e.Problems) != 4 {
		t.Fatalf("%v: want 4 problems", err)
	}
	for _, want := range []string{"name: must be", "limit: invalid limit: period", "on_error: must be", "local_share: must be"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("%v: nothing about %q", err, want)
		}
	}
	if _, err := (FuncRule{Name: "a", Limit: drip.PerSecond(0.5)}).Set(); err == nil || !strings.Contains(err.Error(), "burst must be >= 1") {
		t.Errorf("a burst of 0.5 with costs of 1: %v", err)
	}
}
