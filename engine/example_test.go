package engine_test

import (
	"context"
	"fmt"
	"time"

	"github.com/driplimit/drip/engine"
	"github.com/driplimit/drip/rules"
	"github.com/driplimit/drip/store/memstore"
)

// values is a front door's view of one request: the values it offers
// for the rules' limit keys.
type values map[string]string

func (v values) Value(src rules.Source) (string, bool) {
	if src.Kind == rules.KindGlobal {
		return "", true
	}
	x, ok := v[src.String()]
	return x, ok
}

func (v values) Identity(key string) string { return "key:" + key }

// Cost is 0, false: no rule here costs by a program's function.
func (v values) Cost(*rules.Rule) (float64, bool) { return 0, false }

// A front door of its own: the engine matches the rules, decides, and
// says what to answer. The third request waits 30 s for a token, and
// Retry-After adds the jitter its identity fixes (here 7 s).
func Example() {
	set, err := rules.Parse([]byte(`{"rules": [
	  {"name": "per-key", "limit_keys": ["header:x-api-key"], "algorithm_config": {"rate": 2, "period": "1m", "burst": 2}}]}`), "rules.json")
	if err != nil {
		panic(err)
	}
	store := memstore.New()
	defer store.Close()
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	e := engine.New(store, engine.WithClock(func() time.Time { return now }))
	defer e.Close()
	rs := e.Compile(set)
	for range 3 {
		out := e.Decide(context.Background(), rs, values{"header:x-api-key": "k-1"})
		f := out.Fields()
		fmt.Printf("%v %q %s %s %d\n", out.Allowed, out.Reason, f.RateLimit, f.Policy, f.RetryAfter)
	}
	// Output:
	// true "" "per-key";r=1;t=30 "per-key";q=2;w=60 0
	// true "" "per-key";r=0;t=60 "per-key";q=2;w=60 0
	// false "token_bucket_exceeded" "per-key";r=0;t=37 "per-key";q=2;w=60 37
}
