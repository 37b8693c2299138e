package leased_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/driplimit/drip"
	"github.com/driplimit/drip/bucket"
	"github.com/driplimit/drip/engine"
	"github.com/driplimit/drip/internal/testkit/testserver"
	"github.com/driplimit/drip/rules"
	"github.com/driplimit/drip/store"
	"github.com/driplimit/drip/store/leased"
	"github.com/driplimit/drip/store/memstore"
	"github.com/driplimit/drip/store/redisstore"
)

// byRule counts the blocks fetched per rule (a key's rule is the name
// before its first '|').
type byRule struct {
	mu      sync.Mutex
	fetched map[string]int
}

func (o *byRule) BlockFetched(key string, _ int64) {
	name, _, _ := strings.Cut(key, "|")
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.fetched == nil {
		o.fetched = map[string]int{}
	}
	o.fetched[name]++
}
func (o *byRule) BlockReturned(string, int64) {}
func (o *byRule) BlockExpired(string, int64)  {}

func (o *byRule) count(rule string) int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.fetched[rule]
}

// request is a request's values for the engine: a path and a tenant
// header.
type request struct{ path, tenant string }

func (r request) Value(src rules.Source) (string, bool) {
	switch {
	case src.Kind == rules.KindPath:
		return r.path, true
	case src.Kind == rules.KindHeader && src.Name == "X-Tenant":
		return r.tenant, true
	}
	return "", false
}
func (r request) Identity(key string) string { return "key:" + key }

// Cost is 0, false: no rule here costs by a program's function.
func (r request) Cost(*rules.Rule) (float64, bool) { return 0, false }

// TestRulesMarkWhatIsLeased: a rules file with a leased rule and a plain
// one, decided by the engine on a wrapper that leases the marked limits
// only (leased.Marked), on memory and on one Redis server, in virtual
// time: the plain rule grants exactly its burst of 200 (a refill of one
// a day) out of 300 requests, the leased one at most 200 and, once the
// wrapper gave its blocks back, the store the rest; only the leased
// rule's key takes blocks, and only its takes count as leased decisions.
func TestRulesMarkWhatIsLeased(t *testing.T) {
	set, err := rules.Parse([]byte(`{"rules": [
		{"name": "hot", "limit_keys": ["header:x-tenant"], "match": {"path": "/hot/*"}, "leased": true,
		 "algorithm_config": {"rate": 1, "period": "24h", "burst": 200}},
		{"name": "cold", "limit_keys": ["header:x-tenant"], "match": {"path": "/cold/*"},
		 "algorithm_config": {"rate": 1, "period": "24h", "burst": 200}}]}`), "rules.json")
	if err != nil {
		t.Fatal(err)
	}
	if !set.Rules[0].Limit.Leased || set.Rules[1].Limit.Leased {
		t.Fatalf("leased marks %v, %v; want the first rule's only", set.Rules[0].Limit.Leased, set.Rules[1].Limit.Leased)
	}
	stores := []struct {
		name string
		open func(t *testing.T) store.Store
	}{
		{"memory", func(t *testing.T) store.Store {
			ms := memstore.New(memstore.WithSweep(0))
			t.Cleanup(func() { ms.Close() })
			return ms
		}},
		{"redis", func(t *testing.T) store.Store {
			s, err := redisstore.Open(testserver.SharedRedisURL(t), redisstore.WithPrefix(testserver.Prefix()))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { s.Close() })
			return s
		}},
	}
	for _, sc := range stores {
		t.Run(sc.name, func(t *testing.T) {
			var clock virtual
			clock.now.Store(time.Date(2026, 11, 26, 12, 0, 0, 0, time.UTC).UnixNano())
			obs := &byRule{}
			st := sc.open(t)
			ls, err := leased.New(st, leased.LeaseInProcess(), leased.Marked(), leased.WithClock(clock.Now), leased.WithObserver(obs))
			if err != nil {
				t.Fatal(err)
			}
			defer ls.Close()
			// Without local denials: every decision reaches the leased
			// store, whose counts this test reads.
			eng := engine.New(ls, engine.WithClock(clock.Now), engine.WithTimeout(30*time.Second), engine.WithoutDenials())
			granted := func(eng *engine.Engine, path string) int {
				rs := eng.Compile(set)
				n := 0
				for range 300 {
					clock.now.Add(int64(time.Millisecond))
					out := eng.Decide(context.Background(), rs, request{path, "tenant-1"})
					if out.Err != nil {
						t.Fatalf("%s: %v", path, out.Err)
					}
					if len(out.Applied) != 1 {
						t.Fatalf("%s: %d rules applied, want 1", path, len(out.Applied))
					}
					if out.Allowed {
						n++
					}
				}
				return n
			}
			if n := granted(eng, "/cold/a"); n != 200 {
				t.Errorf("cold: granted %d of 300 on a burst of 200, want exactly 200", n)
			}
			hot := granted(eng, "/hot/a")
			stats := ls.Stats()
			// The instance may deny early while its own blocks are on
			// their way (fetched ahead, given back): Close gives back
			// what it holds, and the store then grants exactly the rest.
			ls.Close()
			rest := granted(engine.New(st, engine.WithClock(clock.Now), engine.WithTimeout(30*time.Second)), "/hot/a")
			if hot > 200 || hot+rest != 200 || stats.TokensLost != 0 {
				t.Errorf("hot: granted %d of 300 leased, then %d from the store (%d micro-tokens lost); want at most 200, and 200 in all", hot, rest, stats.TokensLost)
			}
			if obs.count("hot") == 0 || obs.count("cold") != 0 {
				t.Errorf("blocks fetched: hot %d, cold %d; want some for the leased rule and none for the plain one", obs.count("hot"), obs.count("cold"))
			}
			if stats.Decisions != 300 || stats.Local == 0 {
				t.Errorf("stats %+v: want 300 leased decisions (the plain rule's pass through), some of them local", stats)
			}
		})
	}
}

// TestMarkedPassesTheRest: under Marked, an unmarked item reaches the
// store as it is, and a marked one keeps its mark; without Marked items
// reach the store as they are too (every store decides a key under its
// blocks whatever the mark: nothing is copied to mark them), and a
// sliding window is never leased (its counts are per slot: a block of
// them would outlive the window it was counted in).
func TestMarkedPassesTheRest(t *testing.T) {
	ms := memstore.New(memstore.WithSweep(0))
	defer ms.Close()
	rec := &recording{Store: ms}
	at := time.Unix(1_800_000_000, 0)
	prep := func(l drip.Limit, key string) bucket.Prepared {
		p, err := l.Params(key)
		if err != nil {
			t.Fatal(err)
		}
		var it bucket.Prepared
		if err := store.Prepare(&it, bucket.Peek, key, &p, 1, false, ""); err != nil {
			t.Fatal(err)
		}
		it.Leased = l.Leased
		return it
	}
	plain, marked := prep(drip.PerSecond(100), "plain"), prep(drip.PerSecond(100).WithLeased(true), "marked")
	sliding := prep(drip.Limit{Algorithm: drip.SlidingWindow, Rate: 100}, "sliding")

	only, err := leased.New(rec, leased.LeaseInProcess(), leased.Marked())
	if err != nil {
		t.Fatal(err)
	}
	defer only.Close()
	res := make([]bucket.Result, 2)
	if err := only.Apply(context.Background(), bucket.Peek, at, []bucket.Prepared{plain, marked}, res); err != nil {
		t.Fatal(err)
	}
	if got := rec.last(); got[0].Leased || !got[1].Leased {
		t.Errorf("Marked: marks %v, %v at the store; want the marked item's only", got[0].Leased, got[1].Leased)
	}
	if st := only.Stats(); st.StoreCalls != 1 {
		t.Errorf("Marked: %d store calls counted, want 1 (a call with a marked item)", st.StoreCalls)
	}
	if err := only.Apply(context.Background(), bucket.Peek, at, []bucket.Prepared{plain}, res[:1]); err != nil {
		t.Fatal(err)
	}
	if st := only.Stats(); st.StoreCalls != 1 {
		t.Errorf("Marked: %d store calls counted, want still 1 (an unmarked call passes uncounted)", st.StoreCalls)
	}

	all, err := leased.New(rec, leased.LeaseInProcess())
	if err != nil {
		t.Fatal(err)
	}
	defer all.Close()
	if err := all.Apply(context.Background(), bucket.Peek, at, []bucket.Prepared{plain, sliding}, res); err != nil {
		t.Fatal(err)
	}
	if got := rec.last(); got[0].Leased || got[1].Leased {
		t.Errorf("all: marks %v, %v at the store; want the items as they were", got[0].Leased, got[1].Leased)
	}
	// Takes of one sliding window at one instant: never a block, and
	// never more than its rate.
	take := sliding
	take.Cost = bucket.Micro
	granted := 0
	for range 300 {
		if err := all.Apply(context.Background(), bucket.Take, at, []bucket.Prepared{take}, res[:1]); err != nil {
			t.Fatal(err)
		}
		if res[0].Allowed {
			granted++
		}
	}
	if st := all.Stats(); granted != 100 || st.Fetched != 0 {
		t.Errorf("sliding window: %d granted, %d blocks; want 100 and none", granted, st.Fetched)
	}
}

// recording is a store that keeps the items of its last call.
type recording struct {
	store.Store
	mu    sync.Mutex
	items []bucket.Prepared
}

func (r *recording) Apply(ctx context.Context, op bucket.Op, at time.Time, items []bucket.Prepared, results []bucket.Result) error {
	r.mu.Lock()
	r.items = append(r.items[:0], items...)
	r.mu.Unlock()
	return r.Store.Apply(ctx, op, at, items, results)
}

func (r *recording) last() []bucket.Prepared {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]bucket.Prepared(nil), r.items...)
}

// TestLeasedBesidePlain: a request under a leased rule and a plain one
// takes both, all or nothing, and the plain rule's bucket is one bucket
// whether the leased rule applies beside it or not: on memory and on
// Redis (where a leased limit's state lives apart), its burst of 10
// grants 10 of 30 requests, half of them beside the leased rule.
func TestLeasedBesidePlain(t *testing.T) {
	set, err := rules.Parse([]byte(`{"rules": [
		{"name": "hot", "limit_keys": ["header:x-tenant"], "match": {"path": "/hot/*"}, "leased": true,
		 "algorithm_config": {"rate": 1, "period": "24h", "burst": 200}},
		{"name": "plain", "limit_keys": ["header:x-tenant"],
		 "algorithm_config": {"rate": 1, "period": "24h", "burst": 10}}]}`), "rules.json")
	if err != nil {
		t.Fatal(err)
	}
	for name, open := range map[string]func(t *testing.T) store.Store{
		"memory": func(t *testing.T) store.Store {
			ms := memstore.New(memstore.WithSweep(0))
			t.Cleanup(func() { ms.Close() })
			return ms
		},
		"redis": func(t *testing.T) store.Store {
			s, err := redisstore.Open(testserver.SharedRedisURL(t), redisstore.WithPrefix(testserver.Prefix()))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { s.Close() })
			return s
		},
	} {
		t.Run(name, func(t *testing.T) {
			var clock virtual
			clock.now.Store(time.Date(2026, 11, 26, 12, 0, 0, 0, time.UTC).UnixNano())
			ls, err := leased.New(open(t), leased.LeaseInProcess(), leased.Marked(), leased.WithClock(clock.Now))
			if err != nil {
				t.Fatal(err)
			}
			defer ls.Close()
			eng := engine.New(ls, engine.WithClock(clock.Now), engine.WithTimeout(30*time.Second))
			rs := eng.Compile(set)
			granted := 0
			for i := range 30 {
				clock.now.Add(int64(time.Millisecond))
				path := "/hot/a" // both rules
				if i%2 == 1 {
					path = "/other" // the plain rule alone
				}
				out := eng.Decide(context.Background(), rs, request{path, "tenant-1"})
				if out.Err != nil {
					t.Fatalf("%s: %v", path, out.Err)
				}
				if out.Allowed {
					granted++
				}
			}
			if granted != 10 {
				t.Errorf("granted %d of 30 under the plain rule's burst of 10, want exactly 10", granted)
			}
		})
	}
}
