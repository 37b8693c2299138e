package engine_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/driplimit/drip"
	"github.com/driplimit/drip/engine"
	"github.com/driplimit/drip/override"
	"github.com/driplimit/drip/rules"
	"github.com/driplimit/drip/store/memstore"
)

// TestLeasedRule: a leased rule's mark holds for every limit its keys
// get (its own, one from claims, an override's), and the decide span
// names the leased rules that applied.
func TestLeasedRule(t *testing.T) {
	set, err := rules.Parse([]byte(`{"jwt": {"verify": false}, "rules": [
	  {"name": "hot", "limit_keys": ["header:x-tenant"], "leased": true,
	   "algorithm_config": {"rate": 10, "period": "1m", "burst": 10},
	   "limit_from_claims": {"rate_claim": "rl_rate", "max_rate": 100}},
	  {"name": "plain", "limit_keys": ["header:x-tenant"], "algorithm_config": {"rate": 10, "period": "1m"}}]}`), "rules.json")
	if err != nil {
		t.Fatal(err)
	}
	tp, rec := recorder(t)
	store := memstore.New(memstore.WithSweep(0))
	defer store.Close()
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	e := engine.New(store, engine.WithClock(func() time.Time { return now }), engine.WithTracerProvider(tp))
	defer e.Close()
	rs := e.Compile(set)
	ctx := context.Background()
	marks := func(v values) []bool {
		t.Helper()
		out := e.Decide(ctx, rs, v)
		if len(out.Applied) != 2 || !out.Allowed {
			t.Fatalf("%v: %d rules applied, allowed %v", v, len(out.Applied), out.Allowed)
		}
		return []bool{out.Applied[0].Limit.Leased, out.Applied[1].Limit.Leased}
	}
	want := []bool{true, false}
	if got := marks(values{"header:x-tenant": "a"}); !slices.Equal(got, want) {
		t.Errorf("the rules' own limits: leased %v, want %v", got, want)
	}
	if got := marks(values{"header:x-tenant": "b", "jwt:rl_rate": "50"}); !slices.Equal(got, want) {
		t.Errorf("a limit from claims: leased %v, want %v", got, want)
	}
	// An override, stored without the mark (a limit's JSON has none),
	// is leased as its rule is.
	key := set.Rules[0].Key([]string{"c"})
	if err := override.Set(ctx, store, override.Entry{Rule: "hot", Values: []string{"c"}, Key: key, Limit: drip.Limit{Rate: 1, Period: time.Minute, Burst: 100}}); err != nil {
		t.Fatal(err)
	}
	if err := override.NewFollower(store, override.OnChange(e.SetOverrides)).Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	out := e.Decide(ctx, rs, values{"header:x-tenant": "c"})
	if a := out.Applied[0]; a.Limit.Burst != 100 || !a.Limit.Leased {
		t.Errorf("an override of the leased rule: %+v, want burst 100 and leased", a.Limit)
	}

	n := 0
	for _, s := range rec.Ended() {
		if s.Name() != engine.SpanDecide {
			continue
		}
		n++
		if got := attrs(s)["drip.leased_rules"].AsStringSlice(); !slices.Equal(got, []string{"hot"}) {
			t.Errorf("decide span: drip.leased_rules %q, want [hot]", got)
		}
	}
	if n != 3 {
		t.Errorf("%d decide spans, want 3", n)
	}
}
