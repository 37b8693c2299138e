package rules

import (
	"strings"
	"testing"

	"github.com/driplimit/drip/internal/llm"
)

// TestPrices: a file's price table is read exactly in micro-units of a
// million tokens, cached input and cache writes at the input price when
// not given, and the rules that count a call's price read it.
func TestPrices(t *testing.T) {
	s, err := Parse([]byte(`{"prices": {"gpt-4o": {"input": 2.5, "cached_input": 1.25, "output": 10},
	  "tiny": {"input": 0.000001, "output": 0}, "default": {"input": 3, "output": 15, "cache_write": 3.75}},
	"rules": [{"name": "spend", "limit_keys": ["global"], "budget": "strict", "cost_from_response": "openai:money",
	  "algorithm": "fixed_window", "algorithm_config": {"rate": 5000000, "period": "month", "cost_source": "openai:money"}}]}`), "r.json")
	if err != nil {
		t.Fatal(err)
	}
	want := &llm.Prices{Models: map[string]llm.Price{
		"gpt-4o": {Input: 2_500_000, CachedInput: 1_250_000, CacheWrite: 2_500_000, Output: 10_000_000},
		"tiny":   {Input: 1, CachedInput: 1, CacheWrite: 1},
	}, Default: &llm.Price{Input: 3_000_000, CachedInput: 3_000_000, CacheWrite: 3_750_000, Output: 15_000_000}}
	if g := s.Prices; len(g.Models) != 2 || g.Models["gpt-4o"] != want.Models["gpt-4o"] || g.Models["tiny"] != want.Models["tiny"] || *g.Default != *want.Default {
		t.Errorf("prices %+v, default %+v", g.Models, g.Default)
	}
	r := &s.Rules[0]
	if r.CostSource.Prices != s.Prices || r.CostFrom.Prices != s.Prices {
		t.Errorf("the rule does not read the file's prices")
	}
}

func TestPricesBad(t *testing.T) {
	const rule = `"rules": [{"name": "spend", "limit_keys": ["global"], "cost_from_response": "openai:money",
	  "algorithm_config": {"rate": 5000000, "period": "1h", "cost_source": "anthropic:money"}}]`
	for prices, want := range map[string][]string{
		``: {`rules[0].algorithm_config.cost_source: anthropic:money counts a call's price: the file needs a price table (prices)`,
			`rules[0].cost_from_response: openai:money counts a call's price: the file needs a price table (prices)`},
		`"prices": {"m": {"input": 1.0000001, "output": 1}},`: {`prices.m.input: must have at most six decimals`},
		`"prices": {"m": {"input": -1, "output": 1}},`:        {`prices.m.input: must be at least 0`},
		`"prices": {"m": {"input": 1, "output": 1e7}},`:       {`prices.m.output: must be at most 1000000`},
		`"prices": {"m": {"input": "1", "output": 1}},`:       {`prices.m.input: must be a number, not a string`},
		`"prices": {"m": {"output": 1, "cahced_input": 1}},`:  {`prices.m.input: required`, `prices.m.cahced_input: unknown field (did you mean "cached_input"?)`},
		`"prices": {"m": 3},`:                                 {`prices.m: must be an object`},
	} {
		_, err := Parse([]byte(`{`+prices+rule+`}`), "r.json")
		for _, w := range want {
			if err == nil || !strings.Contains(err.Error(), w) {
				t.Errorf("%s: %v, want %q", prices, err, w)
			}
		}
	}
}
