package llm

import (
	"strings"
	"testing"
)

// TestMoney: a call's worst case and its usage at a model's prices, in
// micro-units, worked by hand and rounded up.
func TestMoney(t *testing.T) {
	prices := &Prices{Models: map[string]Price{
		"gpt-4o": {Input: 2_500_000, CachedInput: 1_250_000, CacheWrite: 2_500_000, Output: 10_000_000},
		"claude": {Input: 3_000_000, CachedInput: 300_000, CacheWrite: 3_750_000, Output: 15_000_000},
	}}
	body := `{"model":"gpt-4o","max_tokens":100,"n":2,"messages":[]}` // 55 bytes
	r := ReadRequest(OpenAI, "/v1/chat/completions", []byte(body))
	// 55 bytes × 2.5 + 200 × 10 = 137.5 + 2000, rounded up.
	if n, why := r.MoneyBound(prices); n != 2138 || why != "" {
		t.Errorf("bound %d %q, want 2138", n, why)
	}
	// 1000 input of which 400 cached, 333 output: 600 × 2.5 + 400 × 1.25
	// + 333 × 10 = 1500 + 500 + 3330.
	u := Usage{Input: 1000, CachedInput: 400, Output: 333, Total: 1333, Reasoning: -1, CacheWrite: -1, CacheRead: -1}
	if n, ok := u.Money(OpenAI, r, prices); n != 5330 || !ok {
		t.Errorf("usage %d %v, want 5330", n, ok)
	}
	// One token of input: 2.5 micro-units, rounded up to 3.
	u = Usage{Input: 1, Output: 0, Total: -1, CachedInput: -1, Reasoning: -1, CacheWrite: -1, CacheRead: -1}
	if n, ok := u.Money(OpenAI, r, prices); n != 3 || !ok {
		t.Errorf("one token %d %v, want 3", n, ok)
	}
	// Anthropic: input, cache reads and writes apart. 10 × 3 + 1000 × 0.3
	// + 100 × 3.75 + 7 × 15 = 30 + 300 + 375 + 105. Its bound takes the
	// input at the dearest input price: 40 bytes × 3.75 + 50 × 15.
	a := ReadRequest(Anthropic, "/v1/messages", []byte(`{"model":"claude","max_tokens":50,"x":1}`))
	u = Usage{Input: 10, CacheRead: 1000, CacheWrite: 100, Output: 7, Total: -1, CachedInput: -1, Reasoning: -1}
	if n, ok := u.Money(Anthropic, a, prices); n != 810 || !ok {
		t.Errorf("anthropic usage %d %v, want 810", n, ok)
	}
	if n, why := a.MoneyBound(prices); n != 900 || why != "" {
		t.Errorf("anthropic bound %d %q, want 900", n, why)
	}
	// Huge counts saturate, never wrap.
	u = Usage{Input: MaxCount, Output: MaxCount, Total: -1, CachedInput: -1, Reasoning: -1, CacheWrite: -1, CacheRead: -1}
	if n, _ := u.Money(OpenAI, r, prices); n != MaxCount {
		t.Errorf("huge %d", n)
	}
	if _, ok := None.Money(OpenAI, r, prices); ok {
		t.Error("no usage has a price")
	}
}

// TestModel: the model a body names, and why a body names none that
// can be priced.
func TestModel(t *testing.T) {
	for body, want := range map[string]string{
		`{"model":"gpt-4o","max_tokens":1}`:                  "gpt-4o",
		`{"model":"gpt-4o","model":"gpt-4o","max_tokens":1}`: "gpt-4o",
		`{"model":"a","model":"b","max_tokens":1}`:           "!its model is given twice",
		`{"model":7,"max_tokens":1}`:                         "!its model is not a name of at most 96 plain bytes",
		`{"model":{"x":1},"max_tokens":1}`:                   "!its model is not a name",
		`{"model":"a\"b","max_tokens":1}`:                    "!its model is not a name of at most 96 plain bytes",
		`{"max_tokens":1,"x":{"model":"deep"}}`:              "!it names no model",
	} {
		r := ReadRequest(OpenAI, "/v1/chat/completions", []byte(body))
		got := r.Model
		if r.ModelWhy != "" {
			got = "!" + r.ModelWhy
		}
		if got != want {
			t.Errorf("%s: %q, want %q", body, got, want)
		}
	}
	long := `{"model":"` + strings.Repeat("m", MaxModel+1) + `"}`
	if r := ReadRequest(OpenAI, "/v1/chat/completions", []byte(long)); r.ModelWhy == "" {
		t.Errorf("a model of %d bytes: %q", MaxModel+1, r.Model)
	}
	// With no price for it: the default row, else why.
	r := ReadRequest(OpenAI, "/v1/chat/completions", []byte(`{"model":"x","max_tokens":1}`))
	if _, why := r.MoneyBound(&Prices{}); why != `its model "x" has no price in the price table` {
		t.Errorf("no price: %q", why)
	}
	if n, why := r.MoneyBound(&Prices{Default: &Price{Input: 1_000_000, Output: 1_000_000}}); n != 29 || why != "" {
		t.Errorf("default: %d %q, want 29 (28 bytes and 1 output token at 1 a million)", n, why)
	}
}
