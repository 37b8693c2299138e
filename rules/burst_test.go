package rules

import (
	"testing"

	"github.com/driplimit/drip"
)

// TestBurstBelowRate: a burst below the rate is a legitimate limit, and
// every way of writing the rate accepts it and gives the same limit.
func TestBurstBelowRate(t *testing.T) {
	want := drip.PerSecond(10).WithBurst(5)
	want.Algorithm = drip.TokenBucket
	for _, cfg := range []string{
		`{"rps": 10, "burst": 5}`,
		`{"tokens_per_second": 10, "burst": 5}`,
		`{"rate": 10, "period": "1s", "burst": 5}`,
		`{"rate": 10, "burst": 5}`,
	} {
		set, err := Parse([]byte(`{"rules": [{"name": "r", "limit_keys": ["ip:address"], "algorithm_config": `+cfg+`}]}`), "r.json")
		if err != nil {
			t.Errorf("%s: %v", cfg, err)
			continue
		}
		if got := set.Rules[0].Limit; got != want {
			t.Errorf("%s: limit %#v, want %#v", cfg, got, want)
		}
	}
}

func TestParent(t *testing.T) {
	for path, want := range map[string]string{
		"rules[2].algorithm_config.burst": "rules[2].algorithm_config",
		"rules[2].algorithm_config":       "rules[2]",
		"rules[2]":                        "rules",
		"rules":                           "",
		`rules[0].match["a.b"]`:           "rules[0].match",
		`rules[0].match["a.b"].x`:         `rules[0].match["a.b"]`,
	} {
		if got := parent(path); got != want {
			t.Errorf("parent(%q) = %q, want %q", path, got, want)
		}
	}
}
