package rules

import (
	"encoding/json"
	"math/big"
	"sort"

	"github.com/driplimit/drip/internal/llm"
)

// A file's price table (prices): per model, what a million input, cached
// input, cache-write and output tokens cost in a currency's units; rules
// that count a call's price ("openai:money") read it.

var priceFields = []string{"input", "cached_input", "cache_write", "output"}

// maxPrice is the dearest price of a million tokens, in a currency's
// units.
const maxPrice = 1_000_000

// prices reads the file's prices: an object of models, each an object of
// prices; the model named "default" prices any other.
func (c *checker) prices(p string, v any) *llm.Prices {
	f, ok := c.object(p, v)
	if !ok {
		return nil
	}
	out := &llm.Prices{Models: map[string]llm.Price{}}
	names := append([]string(nil), f.o.keys...)
	sort.Strings(names)
	for _, name := range names {
		mv, mp, _ := f.get(name)
		mf, ok := c.object(mp, mv)
		if !ok {
			continue
		}
		var pr llm.Price
		at := func(k string, to *int64, required bool) bool {
			x, xp, ok := mf.get(k)
			if !ok {
				if required {
					c.add(field(mp, k), "required: the price of a million %s tokens", k)
				}
				return false
			}
			*to, _ = c.price(xp, x)
			return true
		}
		at("input", &pr.Input, true)
		at("output", &pr.Output, true)
		if !at("cached_input", &pr.CachedInput, false) {
			pr.CachedInput = pr.Input
		}
		if !at("cache_write", &pr.CacheWrite, false) {
			pr.CacheWrite = pr.Input
		}
		mf.done(priceFields...)
		if name == "default" {
			out.Default = &pr
		} else {
			out.Models[name] = pr
		}
	}
	return out
}

// price reads the price of a million tokens in a currency's units (2.5),
// exactly, as micro-units (2,500,000): at least 0, at most maxPrice, with
// at most six decimals.
func (c *checker) price(p string, v any) (int64, bool) {
	n, ok := v.(json.Number)
	if !ok {
		c.add(p, "must be a number, not %s", kindOf(v))
		return 0, false
	}
	r, ok := new(big.Rat).SetString(string(n))
	if !ok {
		c.add(p, "must be a number")
		return 0, false
	}
	r.Mul(r, big.NewRat(1_000_000, 1))
	switch {
	case r.Sign() < 0:
		c.add(p, "must be at least 0")
	case r.Cmp(big.NewRat(maxPrice*1_000_000, 1)) > 0:
		c.add(p, "must be at most %d", maxPrice)
	case !r.IsInt():
		c.add(p, "must have at most six decimals (a micro-unit of the currency)")
	default:
		return r.Num().Int64(), true
	}
	return 0, false
}

// priceRules gives the rules that count a call's price the file's price
// table, and reports those that have none to read.
func (c *checker) priceRules(s *Set) {
	for i := range s.Rules {
		r := &s.Rules[i]
		p := index("rules", r.Index)
		if r.CostSource.Kind == KindBound && isMoney(r.CostSource.Name) {
			if s.Prices == nil {
				c.add(p+".algorithm_config.cost_source", "%s counts a call's price: the file needs a price table (prices)", r.CostSource.Name)
			}
			r.CostSource.Prices = s.Prices
		}
		if r.CostFrom != nil && isMoney(r.CostFrom.API) {
			if s.Prices == nil {
				c.add(p+".cost_from_response", "%s counts a call's price: the file needs a price table (prices)", r.CostFrom.API)
			}
			r.CostFrom.Prices = s.Prices
		}
	}
}

// isMoney reports whether s names a price ("openai:money").
func isMoney(s string) bool {
	_, part, ok := llm.ParseName(s)
	return ok && part == llm.Money
}
