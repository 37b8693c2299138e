package engine_test

import (
	"context"
	"log/slog"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/driplimit/drip"
	"github.com/driplimit/drip/bucket"
	"github.com/driplimit/drip/engine"
	"github.com/driplimit/drip/internal/sfv"
	"github.com/driplimit/drip/rules"
	"github.com/driplimit/drip/store"
	"github.com/driplimit/drip/store/memstore"
)

const inflightSet = `{"rules": [
  {"name": "slots", "limit_keys": ["global"], "algorithm": "concurrency", "on_error": "local", "local_share": 1,
   "algorithm_config": {"max_in_flight": 1, "lease_ttl": "1m"}},
  {"name": "rate", "limit_keys": ["global"], "on_error": "local", "local_share": 1,
   "algorithm_config": {"rate": 3, "period": "1h", "burst": 3}}]}`

// TestOutcomeRelease: a request matching a concurrency rule and a token
// bucket takes both or neither; Release gives the slot back once (not the
// tokens), and is a no-op on an outcome that holds none; the local
// fallback's leases are released there.
func TestOutcomeRelease(t *testing.T) {
	set, err := rules.Parse([]byte(inflightSet), "rules.json")
	if err != nil {
		t.Fatal(err)
	}
	for _, st := range []struct {
		name  string
		store store.Store
	}{{"memory", memstore.New(memstore.WithSweep(0))}, {"local fallback", down{}}} {
		t.Run(st.name, func(t *testing.T) {
			now := time.Unix(1_800_000_000, 0)
			e := engine.New(st.store, engine.WithClock(func() time.Time { return now }), engine.WithLogger(slog.New(slog.DiscardHandler)), withLocal)
			defer e.Close()
			rs := e.Compile(set)
			ctx := context.Background()
			a := e.Decide(ctx, rs, values{})
			if !a.Allowed || !a.Applied[0].Held() || a.Applied[0].Lease == "" {
				t.Fatalf("first request: allowed %v, %+v", a.Allowed, a.Applied)
			}
			b := e.Decide(ctx, rs, values{})
			if b.Allowed || b.Reason != engine.ReasonConcurrency || b.Applied[0].Held() {
				t.Fatalf("second request while the slot is held: allowed %v reason %q", b.Allowed, b.Reason)
			}
			if err := b.Release(ctx); err != nil {
				t.Fatalf("release of a denied outcome: %v", err)
			}
			if rate := b.Applied[1]; rate.Event != engine.NotTaken || rate.Decision.Remaining != 2 {
				t.Errorf("the bucket of the denied request: %v, %d left; want not taken, 2 left", rate.Event, rate.Decision.Remaining)
			}
			cancelled, cancel := context.WithCancel(ctx)
			cancel()
			if err := a.Release(cancelled); err != nil {
				t.Fatalf("release on a cancelled context: %v", err)
			}
			c := e.Decide(ctx, rs, values{})
			if !c.Allowed {
				t.Fatalf("after the release: denied (%s)", c.Reason)
			}
			// A second release of a is nothing: c still holds the slot.
			if err := a.Release(ctx); err != nil {
				t.Fatal(err)
			}
			if d := e.Decide(ctx, rs, values{}); d.Allowed || d.Reason != engine.ReasonConcurrency {
				t.Fatalf("a second release freed c's slot: allowed %v, %s", d.Allowed, d.Reason)
			}
			if err := c.Release(ctx); err != nil {
				t.Fatal(err)
			}
			// The third token goes; then the bucket denies, and a request
			// it denies takes no slot.
			d := e.Decide(ctx, rs, values{})
			if !d.Allowed {
				t.Fatalf("third request: denied (%s)", d.Reason)
			}
			d.Release(ctx)
			if d := e.Decide(ctx, rs, values{}); d.Allowed || d.Reason != engine.ReasonTokenBucket || d.Applied[0].Held() {
				t.Fatalf("fourth request: allowed %v reason %q, want the bucket to deny", d.Allowed, d.Reason)
			}
			if d := e.Decide(ctx, rs, values{}); d.Reason != engine.ReasonTokenBucket || !d.Applied[0].Decision.Allowed {
				t.Fatalf("a request the bucket denied took the slot: reason %q, slot %+v", d.Reason, d.Applied[0].Decision)
			}
		})
	}
}

// TestFieldsWholeQuotas: the RateLimit headers advertise whole quotas,
// rounded down: the local fallback's share of a burst (0.5 of 5 is 2.5)
// is q=2 and RateLimit-Limit 2, and a fractional burst of the store's
// bucket the same. Each is held to the ratelimit-headers draft.
func TestFieldsWholeQuotas(t *testing.T) {
	set, err := rules.Parse([]byte(`{"rules": [
	  {"name": "half", "limit_keys": ["global"], "on_error": "local", "local_share": 0.5,
	   "algorithm_config": {"rate": 1, "burst": 5}},
	  {"name": "frac", "limit_keys": ["global"], "algorithm_config": {"rate": 1, "burst": 2.5}}]}`), "rules.json")
	if err != nil {
		t.Fatal(err)
	}
	now := time.Unix(1_800_000_000, 0)
	for _, c := range []struct {
		store             store.Store
		policy, rl, limit string
	}{
		// The store is down: "half" falls back to 2.5 tokens at 0.5/s
		// (5 s to fill), "frac" allows without a decision.
		{down{}, `"half";q=2;w=5`, `"half";r=1;t=2`, "2"},
		// Both decided by the store: "frac" has the fewest left.
		{memstore.New(memstore.WithSweep(0)), `"half";q=5;w=5, "frac";q=2;w=3`, `"half";r=4;t=1, "frac";r=1;t=1`, "2"},
	} {
		e := engine.New(c.store, engine.WithClock(func() time.Time { return now }), engine.WithLogger(slog.New(slog.DiscardHandler)), withLocal)
		out := e.Decide(context.Background(), e.Compile(set), values{})
		f := out.Fields()
		if f.Policy != c.policy || f.RateLimit != c.rl || f.Limit != c.limit {
			t.Errorf("%T: policy %s, ratelimit %s, limit %s; want %s, %s, %s", c.store, f.Policy, f.RateLimit, f.Limit, c.policy, c.rl, c.limit)
		}
		if err := sfv.CheckHeaders(fieldsGet(f)); err != nil {
			t.Errorf("%T: %v", c.store, err)
		}
		e.Close()
	}
}

// TestFieldsTopHasWindow: of a concurrency rule and a token bucket with as
// few left, the single-value headers describe the bucket, whose reset is a
// wait to tell of, whatever the rules' order and however long the leases.
func TestFieldsTopHasWindow(t *testing.T) {
	set, err := rules.Parse([]byte(`{"rules": [
	  {"name": "slots", "limit_keys": ["global"], "algorithm": "concurrency",
	   "algorithm_config": {"max_in_flight": 1, "lease_ttl": "1h"}},
	  {"name": "rate", "limit_keys": ["global"], "algorithm_config": {"rate": 1, "period": "10s", "burst": 1}}]}`), "rules.json")
	if err != nil {
		t.Fatal(err)
	}
	now := time.Unix(1_800_000_000, 0)
	e := engine.New(memstore.New(memstore.WithSweep(0)), engine.WithClock(func() time.Time { return now }))
	defer e.Close()
	out := e.Decide(context.Background(), e.Compile(set), values{})
	if f := out.Fields(); !out.Allowed || out.Top.Rule.Name != "rate" || f.Limit != "1" || f.Remaining != "0" || f.Reset != "10" {
		t.Errorf("top %s, limit %s, remaining %s, reset %q; want rate's: 1, 0, 10", out.Top.Rule.Name, f.Limit, f.Remaining, f.Reset)
	}
}

// withLocal hands an engine the memory store of on_error local, as
// drip's front doors do.
var withLocal = engine.WithLocal(func() store.Store { return memstore.New(memstore.WithSweep(0)) })

// TestLocalNotHandedIn: an engine given no local store (WithLocal) allows
// a request whose on_error local rule meets a failing store, as on_error
// allow would, and decides nothing for it.
func TestLocalNotHandedIn(t *testing.T) {
	set, err := rules.Parse([]byte(inflightSet), "rules.json")
	if err != nil {
		t.Fatal(err)
	}
	e := engine.New(down{}, engine.WithLogger(slog.New(slog.DiscardHandler)))
	defer e.Close()
	out := e.Decide(context.Background(), e.Compile(set), values{})
	if !out.Allowed || out.Err == nil {
		t.Fatalf("allowed %v, err %v; want allowed with the store's error", out.Allowed, out.Err)
	}
	for _, a := range out.Applied {
		if a.Event != engine.ErrorAllowed || a.Decided || a.Local {
			t.Errorf("%s: %v, decided %v, local %v; want error_allowed, undecided", a.Rule.Name, a.Event, a.Decided, a.Local)
		}
	}
}

// fieldsGet reads the header values of f by their header names, as the
// RateLimit headers carry them.
func fieldsGet(f engine.Fields) func(string) string {
	h := map[string]string{"RateLimit-Policy": f.Policy, "RateLimit": f.RateLimit, "RateLimit-Limit": f.Limit,
		"RateLimit-Remaining": f.Remaining, "RateLimit-Reset": f.Reset}
	if f.RetryAfter > 0 {
		h["Retry-After"] = strconv.FormatInt(f.RetryAfter, 10)
	}
	return func(name string) string { return h[name] }
}

// TestAppliedOrder: the rules that apply are listed enforce rules first,
// each kind in file order, however the file interleaves them.
func TestAppliedOrder(t *testing.T) {
	set, err := rules.Parse([]byte(`{"rules": [
	  {"name": "s1", "mode": "shadow", "limit_keys": ["global"], "algorithm_config": {"rate": 5}},
	  {"name": "e1", "limit_keys": ["global"], "algorithm_config": {"rate": 5}},
	  {"name": "s2", "mode": "shadow", "limit_keys": ["global"], "algorithm_config": {"rate": 5}},
	  {"name": "s3", "mode": "shadow", "limit_keys": ["global"], "algorithm_config": {"rate": 5}},
	  {"name": "e2", "limit_keys": ["global"], "algorithm_config": {"rate": 5}},
	  {"name": "e3", "limit_keys": ["global"], "algorithm_config": {"rate": 5}}]}`), "rules.json")
	if err != nil {
		t.Fatal(err)
	}
	e := engine.New(memstore.New(memstore.WithSweep(0)))
	defer e.Close()
	out := e.Decide(context.Background(), e.Compile(set), values{})
	var names []string
	for _, a := range out.Applied {
		names = append(names, a.Rule.Name)
		if a.Event != engine.Allowed || !a.Decided || a.Decision.Remaining != 4 {
			t.Errorf("%s: %v, decided %v, %d left; want allowed, 4 left", a.Rule.Name, a.Event, a.Decided, a.Decision.Remaining)
		}
	}
	if got := strings.Join(names, " "); got != "e1 e2 e3 s1 s2 s3" {
		t.Errorf("applied %s, want e1 e2 e3 s1 s2 s3", got)
	}
}

// TestLocalWindows: the local fallback places a fixed window without
// start by its key and a calendar window by the decision's time, as
// drip.Apply does with the same (shared) limit: the same decisions
// across the windows' ends (midnight in Paris among them), with slots
// released.
func TestLocalWindows(t *testing.T) {
	set, err := rules.Parse([]byte(`{"rules": [
	  {"name": "keyed", "limit_keys": ["global"], "algorithm": "fixed_window", "on_error": "local", "local_share": 0.5,
	   "algorithm_config": {"rate": 6, "period": "10s"}},
	  {"name": "day", "limit_keys": ["global"], "algorithm": "fixed_window", "on_error": "local", "local_share": 0.5,
	   "algorithm_config": {"rate": 8, "period": "day", "time_zone": "Europe/Paris"}},
	  {"name": "slots", "limit_keys": ["global"], "algorithm": "concurrency", "on_error": "local", "local_share": 1,
	   "algorithm_config": {"max_in_flight": 2, "lease_ttl": "1m"}}]}`), "rules.json")
	if err != nil {
		t.Fatal(err)
	}
	now := time.Date(2026, 3, 28, 22, 59, 0, 0, time.UTC) // a minute before midnight in Paris
	e := engine.New(down{}, engine.WithClock(func() time.Time { return now }), engine.WithLogger(slog.New(slog.DiscardHandler)), withLocal)
	defer e.Close()
	rs := e.Compile(set)
	ref := memstore.New(memstore.WithSweep(0))
	defer ref.Close()
	for i := range 60 {
		now = now.Add(1700 * time.Millisecond)
		out := e.Decide(context.Background(), rs, values{})
		var reqs, held []drip.Request
		var as []engine.Applied
		for _, a := range out.Applied {
			if a.Local && a.Decided {
				r := drip.Request{Key: a.Key, Limit: a.Limit, Cost: a.Cost, Lease: a.Lease}
				reqs, as = append(reqs, r), append(as, a)
				if a.Lease != "" {
					held = append(held, r)
				}
			}
		}
		m, err := drip.Apply(context.Background(), ref, bucket.Take, now, reqs...)
		if err != nil {
			t.Fatal(err)
		}
		for j, a := range as {
			// A take that was allowed but not applied (another was
			// denied) reports its bucket as it is (beforeTake).
			if (m.Allowed || !m.Decisions[j].Allowed) && m.Decisions[j] != a.Decision {
				t.Fatalf("request %d, %s: %+v; drip.Apply's %+v", i, a.Rule.Name, a.Decision, m.Decisions[j])
			}
		}
		if i%2 == 0 && m.Allowed && len(held) > 0 {
			if _, err := drip.Apply(context.Background(), ref, bucket.Refund, now, held...); err != nil {
				t.Fatal(err)
			}
		}
		if i%2 == 0 {
			if err := out.Release(context.Background()); err != nil {
				t.Fatal(err)
			}
		}
	}
}
