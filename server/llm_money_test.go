package server

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/big"
	"math/rand/v2"
	"path/filepath"
	"strings"
	"testing"

	"github.com/driplimit/drip/internal/testkit/teststores"
	"github.com/driplimit/drip/store"
	"github.com/driplimit/drip/store/memstore"
)

// moneyRules is a strict monthly budget of one currency unit (1,000,000
// micro-units) a key, priced by a table of two models.
const moneyRules = `key_secret_env: DRIP_KEY_SECRET
prices:
  gpt-4o: {input: 2.5, cached_input: 1.25, output: 10}
  gpt-4o-mini: {input: 0.15, output: 0.6}
rules:
  - name: spend
    limit_keys: ["hash:api_key"]
    budget: strict
    cost_from_response: openai:money
    algorithm: fixed_window
    algorithm_config: {rate: 1000000, period: month, time_zone: Europe/Berlin, cost_source: openai:money}
`

// TestLLMMoney: a money budget takes a call's worst case at the prices
// of its model and keeps what its usage costs, cached input priced
// apart, rounded up to the micro-unit; a model the table does not price
// is refused (400) under a strict budget, and priced by the default row
// when the table has one.
func TestLLMMoney(t *testing.T) {
	for _, name := range []string{"memory", "postgres", "redis"} {
		t.Run(name, func(t *testing.T) { testLLMMoney(t, teststores.Open(t, name)) })
	}
}

func testLLMMoney(t *testing.T, st store.Store) {
	file := filepath.Join(t.TempDir(), "rules.yaml")
	writeFile(t, file, moneyRules)
	e := newLLMEnv(t, st, file)
	post := func(model string, hs ...string) (int, string) {
		t.Helper()
		body := `{"model":"` + model + `","max_tokens":100,"messages":[{"role":"user","content":"hello there"}]}`
		res := e.call(t, context.Background(), "/v1/chat/completions", "sk-money", body, hs...)
		b, _ := io.ReadAll(res.Body)
		res.Body.Close()
		return res.StatusCode, string(b)
	}
	// gpt-4o: 37 input tokens of which 20 cached, 13 output:
	// 17 × 2.5 + 20 × 1.25 + 13 × 10 = 42.5 + 25 + 130 = 197.5, so 198.
	if code, b := post("gpt-4o", "X-Test-Prompt-Tokens", "37", "X-Test-Cached-Tokens", "20", "X-Test-Completion-Tokens", "13"); code != 200 {
		t.Fatalf("gpt-4o: %d %s", code, b)
	}
	e.waitEvent(t, "spend", "refunded", 1)
	if got := e.left(t, "spend", "sk-money"); got != 1_000_000-198 {
		t.Errorf("after gpt-4o: %v left, want 999802 (198 spent)", got)
	}
	// gpt-4o-mini, cached input at the input price: 50 × 0.15 + 7 × 0.6
	// = 7.5 + 4.2 = 11.7, so 12.
	if code, b := post("gpt-4o-mini", "X-Test-Prompt-Tokens", "50", "X-Test-Completion-Tokens", "7"); code != 200 {
		t.Fatalf("gpt-4o-mini: %d %s", code, b)
	}
	e.waitEvent(t, "spend", "refunded", 2)
	if got := e.left(t, "spend", "sk-money"); got != 1_000_000-198-12 {
		t.Errorf("after gpt-4o-mini: %v left, want 999790 (210 spent)", got)
	}
	// A model with no price: refused, nothing taken.
	code, b := post("gpt-5-turbo")
	if code != 400 || !strings.Contains(b, `has no price`) || !strings.Contains(b, `gpt-5-turbo`) {
		t.Errorf("unpriced model: %d %s", code, b)
	}
	if got := e.left(t, "spend", "sk-money"); got != 1_000_000-210 {
		t.Errorf("after the unpriced model: %v left, want 999790", got)
	}
	// A call whose worst case is over the budget: 200,000 output tokens
	// at 10 a million are 2,000,000 micro-units.
	res := e.call(t, context.Background(), "/v1/chat/completions", "sk-money", `{"model":"gpt-4o","max_tokens":200000}`)
	res.Body.Close()
	if res.StatusCode != 429 || res.Header.Get("X-Should-Retry") != "false" {
		t.Errorf("a worst case over the budget: %d, x-should-retry %q", res.StatusCode, res.Header.Get("X-Should-Retry"))
	}

}

// TestLLMMoneyUnpriced: with a default row, a model the table does not
// name is priced by it; under a soft budget without one, a call of such
// a model takes its default_cost and keeps it, its usage unreported.
func TestLLMMoneyUnpriced(t *testing.T) {
	file := filepath.Join(t.TempDir(), "rules.yaml")
	writeFile(t, file, strings.Replace(moneyRules, "prices:\n", "prices:\n  default: {input: 1, output: 2}\n", 1))
	e := newLLMEnv(t, memstore.New(), file)
	body := `{"model":"gpt-5-turbo","max_tokens":100}`
	call := func(e *llmEnv) int {
		res := e.call(t, context.Background(), "/v1/chat/completions", "sk-money", body)
		io.Copy(io.Discard, res.Body)
		res.Body.Close()
		return res.StatusCode
	}
	// 10 input tokens at 1 a million, 20 output at 2: 50 micro-units.
	if code := call(e); code != 200 {
		t.Fatalf("a default price: %d", code)
	}
	e.waitEvent(t, "spend", "refunded", 1)
	if got := e.left(t, "spend", "sk-money"); got != 1_000_000-50 {
		t.Errorf("a default price: %v left, want 999950", got)
	}

	soft := strings.Replace(moneyRules, "    budget: strict\n", "", 1)
	soft = strings.Replace(soft, "cost_source: openai:money}", "cost_source: openai:money, default_cost: 5000}", 1)
	file = filepath.Join(t.TempDir(), "rules.yaml")
	writeFile(t, file, soft)
	e = newLLMEnv(t, memstore.New(), file)
	if code := call(e); code != 200 {
		t.Fatalf("soft, unpriced: %d", code)
	}
	e.waitEvent(t, "spend", "unreported", 1)
	if got := e.left(t, "spend", "sk-money"); got != 1_000_000-5000 {
		t.Errorf("soft, unpriced: %v left, want 995000 (its default_cost)", got)
	}
}

// TestLLMMoneyStrictNeverExceeded: 64 concurrent streams on a strict
// money budget of 20,000 micro-units, with aborts, cut streams, upstream
// errors and clients that give max_tokens or the model twice: what the
// upstream spent, at the table's prices, never exceeds the budget.
func TestLLMMoneyStrictNeverExceeded(t *testing.T) {
	file := filepath.Join(t.TempDir(), "rules.yaml")
	writeFile(t, file, strings.Replace(moneyRules, "rate: 1000000", "rate: 20000", 1))
	e := newLLMEnv(t, memstore.New(), file)
	status := e.storm(t, 11, "sk-many", func(rng *rand.Rand) string {
		maxTok := 1 + rng.IntN(400)
		switch rng.IntN(5) {
		case 0: // says a small max_tokens, then a larger one
			return fmt.Sprintf(`{"model":"gpt-4o","max_tokens":1,"stream":true,"max_tokens":%d}`, maxTok)
		case 1: // names the cheap model, then the dear one (which the upstream reads)
			return fmt.Sprintf(`{"model":"gpt-4o-mini","stream":true,"max_tokens":%d,"model":"gpt-4o"}`, maxTok)
		}
		return fmt.Sprintf(`{"model":"gpt-4o","stream":true,"max_tokens":%d,"messages":[{"role":"user","content":"%s"}]}`, maxTok, strings.Repeat("x", rng.IntN(200)))
	})
	e.waitSettled(t, "spend")
	// What the upstream spent, exactly: input at 2.5 and output at 10 a
	// million tokens, in micro-units.
	in, out := e.up.Input(), e.up.Spent()-e.up.Input()
	spent := new(big.Rat).SetFrac64(in*2_500_000+out*10_000_000, 1_000_000)
	left := e.left(t, "spend", "sk-many")
	t.Logf("statuses %v; the upstream spent %d input and %d output tokens, %s micro-units; %v left", status, in, out, spent.FloatString(1), left)
	if spent.Cmp(big.NewRat(20000, 1)) > 0 || left < 0 {
		t.Errorf("the strict money budget was exceeded: the upstream spent %s micro-units of 20,000 (%v left)", spent.FloatString(1), left)
	}
	// The spend the metrics show is what the budget counts, in
	// micro-units, not tokens.
	m := scrape(t, e.srv.admin)
	if got, ok := m[`drip_spent_micro_units_total{rule=spend}`]; got != 20000-left || !ok {
		t.Errorf("drip_spent_micro_units_total: %v (%v), want %v", got, ok, 20000-left)
	}
	if _, ok := m[`drip_spent_tokens_total{rule=spend}`]; ok {
		t.Error("a money budget's spend counted as tokens")
	}
	if status[429] == 0 || status[200] == 0 || status[400] == 0 {
		t.Errorf("statuses %v: want calls allowed, denied and refused (a model named twice)", status)
	}
}

// TestAdminTenantSpend: one admin call answers what an API key has spent
// this month and what is left, in micro-units and in the currency's
// units, beside its token budget and its requests a minute: what the
// gateway charged.
func TestAdminTenantSpend(t *testing.T) {
	file := filepath.Join(t.TempDir(), "rules.yaml")
	writeFile(t, file, moneyRules+`  - name: tokens-day
    limit_keys: ["hash:api_key"]
    cost_from_response: openai
    algorithm: fixed_window
    algorithm_config: {rate: 100000, period: day, cost_source: openai}
  - name: rpm
    limit_keys: ["hash:api_key"]
    algorithm_config: {rate: 60, period: 1m}
`)
	e := newLLMEnv(t, memstore.New(), file)
	for range 2 { // 198 micro-units and 50 tokens each
		res := e.call(t, context.Background(), "/v1/chat/completions", "sk-money", `{"model":"gpt-4o","max_tokens":100}`,
			"X-Test-Prompt-Tokens", "37", "X-Test-Cached-Tokens", "20", "X-Test-Completion-Tokens", "13")
		io.Copy(io.Discard, res.Body)
		res.Body.Close()
		if res.StatusCode != 200 {
			t.Fatalf("%d", res.StatusCode)
		}
	}
	e.waitEvent(t, "spend", "refunded", 2)
	e.waitEvent(t, "tokens-day", "refunded", 2)
	code, out := admin(t, "POST", e.srv.admin+"/v1/admin/tenant", `{"headers": {"authorization": "Bearer sk-money"}}`)
	if code != 200 {
		t.Fatalf("tenant: %d %s", code, out)
	}
	var got struct{ Rules []tenantRule }
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatal(err)
	}
	want := map[string]tenantSpend{
		"spend":      {Unit: "micro-units", Spent: 396, Left: 1_000_000 - 396, Of: 1_000_000, SpentUnits: "0.000396", LeftUnits: "0.999604"},
		"tokens-day": {Unit: "tokens", Spent: 100, Left: 100_000 - 100, Of: 100_000},
		"rpm":        {Unit: "requests", Spent: 2, Left: 58, Of: 60},
	}
	for _, r := range got.Rules {
		w := want[r.Rule]
		if !r.Applies || r.Spend == nil || *r.Spend != w {
			t.Errorf("%s: %+v, spend %+v; want %+v", r.Rule, r, r.Spend, w)
			continue
		}
		if left := e.left(t, r.Rule, "sk-money"); left != r.Spend.Left {
			t.Errorf("%s: the picture says %v left, the bucket %v", r.Rule, r.Spend.Left, left)
		}
	}
	if m := scrape(t, e.srv.admin); m[`drip_spent_micro_units_total{rule=spend}`] != 396 || m[`drip_spent_tokens_total{rule=tokens-day}`] != 100 {
		t.Errorf("the metrics' spend: %v micro-units, %v tokens; want 396 and 100", m[`drip_spent_micro_units_total{rule=spend}`], m[`drip_spent_tokens_total{rule=tokens-day}`])
	}
	if len(got.Rules) != 3 {
		t.Errorf("%d rules: %s", len(got.Rules), out)
	}
	if strings.Contains(out, "sk-money") {
		t.Errorf("the picture shows the API key: %s", out)
	}
}
