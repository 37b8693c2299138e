package llm

import (
	"math/big"
	"strconv"
)

// Money is the part of a rule's name ("openai:money") that counts a
// call's price, in micro-units of a currency, from a price table
// (Prices), rather than its tokens.
const Money Part = "money"

// MaxModel is the longest model name read from a request's body: a
// longer one has no price.
const MaxModel = maxCapture

// Price is one model's prices, each in micro-units of a currency per
// million tokens (a price of 2.5 a million tokens is 2,500,000).
// CachedInput prices the input tokens read from a cache (OpenAI's
// cached_tokens, Anthropic's cache_read_input_tokens), CacheWrite those
// written to Anthropic's cache (cache_creation_input_tokens); each is
// the Input price when the table does not give it.
type Price struct {
	Input, CachedInput, CacheWrite, Output int64
}

// Prices is a price table: the prices of each model by its name as
// requests send it ("model"), and Default, when set, for any other.
type Prices struct {
	Models  map[string]Price
	Default *Price
}

// Of is the price of model: its row, else Default; why says why there is
// none.
func (p *Prices) Of(model string) (Price, string) {
	if p == nil {
		return Price{}, "no price table"
	}
	if pr, ok := p.Models[model]; ok {
		return pr, ""
	}
	if p.Default != nil {
		return *p.Default, ""
	}
	return Price{}, "its model " + strconv.Quote(model) + " has no price in the price table"
}

// priced is the micro-units of tokens × price (micro-units per million
// tokens), summed over pairs and rounded up, so that a budget is never
// underspent by rounding; at most MaxCount.
func priced(pairs ...int64) int64 {
	sum := new(big.Int)
	var t big.Int
	for i := 0; i+1 < len(pairs); i += 2 {
		if pairs[i] > 0 && pairs[i+1] > 0 {
			sum.Add(sum, t.Mul(big.NewInt(pairs[i]), big.NewInt(pairs[i+1])))
		}
	}
	// Rounded up: (sum + 999,999) / 1,000,000.
	sum.Add(sum, big.NewInt(999_999))
	sum.Quo(sum, big.NewInt(1_000_000))
	if !sum.IsInt64() || sum.Int64() > MaxCount {
		return MaxCount
	}
	return sum.Int64()
}

// MoneyBound is the most the call can cost under prices, in micro-units:
// its input bound (the body's bytes) at the dearest of the input prices
// (the input could all be written to a cache, or read from one) plus its
// output bound at the output price. why says why there is none: a part
// with no bound, a model with no name or no price.
func (r Request) MoneyBound(prices *Prices) (int64, string) {
	if r.InputWhy != "" {
		return -1, r.InputWhy
	}
	if r.OutputWhy != "" {
		return -1, r.OutputWhy
	}
	p, why := r.price(prices)
	if why != "" {
		return -1, why
	}
	in := max(p.Input, p.CachedInput, p.CacheWrite)
	return priced(r.Input, in, r.Output, p.Output), ""
}

// price is the price of the request's model.
func (r Request) price(prices *Prices) (Price, string) {
	if r.ModelWhy != "" {
		if prices != nil && prices.Default != nil {
			return *prices.Default, ""
		}
		return Price{}, r.ModelWhy
	}
	return prices.Of(r.Model)
}

// Money is what the usage costs under the price of the request's model,
// in micro-units, rounded up; ok false when the usage reported none of
// its input and output tokens, or the model has no price. OpenAI's input
// tokens hold its cached ones, priced apart; Anthropic's input tokens,
// cache reads and cache writes are apart.
func (u Usage) Money(api API, r Request, prices *Prices) (int64, bool) {
	if u.Input < 0 && u.Output < 0 {
		return 0, false
	}
	p, why := r.price(prices)
	if why != "" {
		return 0, false
	}
	in, out := max(u.Input, 0), max(u.Output, 0)
	if api == Anthropic {
		return priced(in, p.Input, max(u.CacheRead, 0), p.CachedInput, max(u.CacheWrite, 0), p.CacheWrite, out, p.Output), true
	}
	cached := min(max(u.CachedInput, 0), in)
	return priced(in-cached, p.Input, cached, p.CachedInput, out, p.Output), true
}

// Money is the call's price (Usage.Money), ok false until the body
// reported its whole usage (Tokens).
func (s *Scanner) Money(api API, r Request, prices *Prices) (int64, bool) {
	if s == nil || !s.final {
		return 0, false
	}
	return s.usage.Money(api, r, prices)
}
