package engine_test

import (
	"context"
	"testing"

	"github.com/driplimit/drip"
	"github.com/driplimit/drip/engine"
	"github.com/driplimit/drip/internal/testkit/testclock"
	"github.com/driplimit/drip/override"
	"github.com/driplimit/drip/rules"
	"github.com/driplimit/drip/store/memstore"
)

// TestLimitPrecedence: a key's override wins over its token's claims,
// which win over the rule's own limit; claims are clamped to their
// bounds, and a claim that is not a positive number leaves the rule's
// value. Decide applies the limit (burst, RateLimit-Policy) on the
// bucket of the request's own key, whose tokens carry over and are
// clamped to a lower burst.
func TestLimitPrecedence(t *testing.T) {
	set, err := rules.Parse([]byte(`{"jwt": {"verify": false}, "rules": [
	  {"name": "api", "limit_keys": ["header:x-tenant"],
	   "algorithm_config": {"rate": 10, "period": "1m", "burst": 10},
	   "limit_from_claims": {"rate_claim": "rl_rate", "burst_claim": "rl_burst", "max_rate": 100, "max_burst": 50, "min_burst": 2}}]}`), "rules.json")
	if err != nil {
		t.Fatal(err)
	}
	store := memstore.New(memstore.WithSweep(0))
	clock := testclock.New()
	e := engine.New(store, engine.WithClock(clock.Now))
	defer e.Close()
	rs := e.Compile(set)
	decide := func(v values) (drip.Limit, engine.Applied) {
		t.Helper()
		out := e.Decide(context.Background(), rs, v)
		if len(out.Applied) != 1 {
			t.Fatalf("%v: %d rules applied", v, len(out.Applied))
		}
		return out.Applied[0].Limit, out.Applied[0]
	}
	rule := set.Rules[0].Limit
	for _, c := range []struct {
		name   string
		claims values
		want   drip.Limit
	}{
		{"no claims", values{}, rule},
		{"both claimed", values{"jwt:rl_rate": "20", "jwt:rl_burst": "30"}, with(rule, 20, 30)},
		{"clamped above", values{"jwt:rl_rate": "1e9", "jwt:rl_burst": "51"}, with(rule, 100, 50)},
		{"clamped below", values{"jwt:rl_rate": "0.5", "jwt:rl_burst": "1"}, with(rule, 1, 2)},
		{"not numbers", values{"jwt:rl_rate": "lots", "jwt:rl_burst": "-3"}, rule},
		{"rate only", values{"jwt:rl_rate": "40", "jwt:rl_burst": "NaN"}, with(rule, 40, 10)},
	} {
		v := values{"header:x-tenant": "t-" + c.name}
		for k, x := range c.claims {
			v[k] = x
		}
		if got, _ := decide(v); got != c.want {
			t.Errorf("%s: limit %+v, want %+v", c.name, got, c.want)
		}
	}

	// acme's claims give a bucket of 30: spend 6. Then override acme's
	// limit: its claims no longer count, other tenants keep theirs, and
	// the bucket keeps its tokens, clamped to a lower burst.
	acme := values{"header:x-tenant": "acme", "jwt:rl_rate": "20", "jwt:rl_burst": "30"}
	for range 6 {
		decide(acme)
	}
	follower := override.NewFollower(store, override.OnChange(e.SetOverrides))
	ctx := context.Background()
	key := set.Rules[0].Key([]string{"acme"})
	refresh := func() {
		t.Helper()
		if err := follower.Refresh(ctx); err != nil {
			t.Fatal(err)
		}
	}
	put := func(l drip.Limit) {
		t.Helper()
		if err := override.Set(ctx, store, override.Entry{Rule: "api", Values: []string{"acme"}, Key: key, Limit: l}); err != nil {
			t.Fatal(err)
		}
		refresh()
	}
	over := drip.Limit{Algorithm: drip.TokenBucket, Rate: 1, Period: rule.Period, Burst: 1000}
	put(over)
	out := e.Decide(ctx, rs, acme)
	if a := out.Applied[0]; a.Limit != over || a.Decision.Remaining != 23 || !a.Decision.Allowed {
		t.Fatalf("raised by an override: %+v %+v, want 23 remaining", a.Limit, a.Decision)
	}
	if p := out.Fields().Policy; p != `"api";q=1000;w=60000` {
		t.Fatalf("RateLimit-Policy %s", p)
	}
	if l, _ := decide(values{"header:x-tenant": "bob", "jwt:rl_rate": "20", "jwt:rl_burst": "30"}); l != with(rule, 20, 30) {
		t.Fatalf("another tenant: %+v", l)
	}
	put(with(over, 1, 5))
	if _, a := decide(acme); a.Limit.Burst != 5 || a.Decision.Remaining != 4 {
		t.Fatalf("lowered to 5 by an override: %+v %+v, want 4 remaining", a.Limit, a.Decision)
	}
	if ok, err := store.DeleteOverride(ctx, key); !ok || err != nil {
		t.Fatal(ok, err)
	}
	refresh()
	if l, a := decide(acme); l != with(rule, 20, 30) || a.Decision.Remaining != 3 {
		t.Fatalf("override deleted: %+v %+v, want the claims' limit and 3 remaining", l, a.Decision)
	}
	if e.Overrides().Version() == 0 || len(e.Overrides().Entries()) != 0 {
		t.Fatalf("snapshot %+v", e.Overrides())
	}
}

func with(l drip.Limit, rate, burst float64) drip.Limit {
	l.Rate, l.Burst = rate, burst
	return l
}
