package storetest

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/driplimit/drip"
	"github.com/driplimit/drip/bucket"
	"github.com/driplimit/drip/store"
)

// notColocated is the store under test refusing every multi-key call as
// Redis Cluster refuses keys in different hash slots.
type notColocated struct{ store.Store }

func (s notColocated) Apply(ctx context.Context, op bucket.Op, at time.Time, items []bucket.Prepared, results []bucket.Result) error {
	if len(items) > 1 {
		return fmt.Errorf("storetest: %w", store.ErrNotColocated)
	}
	return s.Store.Apply(ctx, op, at, items, results)
}

func (s notColocated) Caps() store.Caps {
	c := s.Store.Caps()
	c.SplitsKeys = true
	return c
}

// failing is the store under test failing the take of any key that ends
// in ":fail", as a store does whose caller's deadline passes: it cancels
// the caller's context and answers its error, having taken nothing.
type failing struct {
	store.Store
	cancel context.CancelFunc
}

func (s failing) Apply(ctx context.Context, op bucket.Op, at time.Time, items []bucket.Prepared, results []bucket.Result) error {
	for _, it := range items {
		if op == bucket.Take && strings.HasSuffix(it.Key, ":fail") {
			s.cancel()
			return ctx.Err()
		}
	}
	return s.Store.Apply(ctx, op, at, items, results)
}

// RunSeparately checks multi-takes applied one request at a time
// (store.Separately) on the store: over the store made to refuse them
// (store.ErrNotColocated, as Redis Cluster does across hash slots), and
// with Separately.Always. Every step is made twice, on keys of its own
// with the store's one atomic multi-take and on keys of its own one by
// one, and must give the same decisions and leave the same state: a
// denied multi-take leaves no token and no slot taken, whichever request
// denies it. A take that fails in the middle leaves nothing taken either,
// though its context has ended.
func RunSeparately(t *testing.T, newStore NewStore) {
	st := newStore(t)
	for _, v := range []struct {
		name string
		sep  store.Store
	}{
		{"ErrNotColocated", store.Separately{Store: notColocated{st}}},
		{"Always", store.Separately{Store: st, Always: true}},
	} {
		t.Run(v.name, func(t *testing.T) { runSeparately(t, st, v.sep) })
	}
	t.Run("a take failing in the middle", func(t *testing.T) {
		p := prefix()
		at := base()
		tb := drip.PerMinute(1).WithBurst(3)
		one := drip.InFlight(1, time.Minute)
		c, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		sep := store.Separately{Store: failing{Store: st, cancel: cancel}, Always: true}
		_, err := drip.Apply(c, sep, bucket.Take, at, []drip.Request{
			{Key: p + "tb", Limit: tb, Cost: 1}, {Key: p + "c", Limit: one, Lease: "L1"},
			{Key: p + "x:fail", Limit: tb, Cost: 1}}...)
		if err == nil {
			t.Fatal("a multi-take whose third take failed answered no error")
		}
		c = ctx(t)
		if d, err := Apply(c, st, bucket.Peek, at, drip.Request{Key: p + "tb", Limit: tb}); err != nil || d.Tokens != 3 {
			t.Errorf("after the failed multi-take the bucket holds %v (%v), want 3: nothing may stay taken", d.Tokens, err)
		}
		if d, err := Apply(c, st, bucket.Peek, at, drip.Request{Key: p + "c", Limit: one}); err != nil || d.Remaining != 1 {
			t.Errorf("after the failed multi-take %d slots are free (%v), want 1: nothing may stay taken", d.Remaining, err)
		}
	})
}

func runSeparately(t *testing.T, st, sep store.Store) {
	c := ctx(t)
	at := base()
	one := drip.InFlight(1, time.Minute)
	two := drip.InFlight(2, time.Minute)
	r := drip.PerMinute(1)
	tb := drip.PerMinute(1).WithBurst(3)
	limits := map[string]drip.Limit{"c": one, "d": two, "r": r, "tb": tb}
	names := []string{"c", "d", "r", "tb"}
	pa, ps := prefix(), prefix() // the atomic multi-takes', the separate ones'

	// item is a request: a key of limits, and a lease or a cost.
	type item struct {
		key   string
		lease string
		cost  float64
	}
	reqs := func(p string, its []item) []drip.Request {
		rs := make([]drip.Request, len(its))
		for i, it := range its {
			rs[i] = drip.Request{Key: p + it.key, Limit: limits[it.key], Lease: it.lease, Cost: it.cost}
		}
		return rs
	}
	// step makes a call on both sets of keys, and checks that the answers
	// and the state after are the same.
	step := func(what string, op bucket.Op, its ...item) drip.Multi {
		t.Helper()
		want, err := drip.Apply(c, st, op, at, reqs(pa, its)...)
		if err != nil {
			t.Fatalf("%s, in one atomic step: %v", what, err)
		}
		got, err := drip.Apply(c, sep, op, at, reqs(ps, its)...)
		if err != nil {
			t.Fatalf("%s, one by one: %v", what, err)
		}
		if got.Allowed != want.Allowed || got.RetryAfter != want.RetryAfter || len(got.Decisions) != len(want.Decisions) {
			t.Fatalf("%s: one by one %+v, in one step %+v", what, got, want)
		}
		for i := range want.Decisions {
			if got.Decisions[i] != want.Decisions[i] {
				t.Errorf("%s, result %d (%s): one by one %+v, in one step %+v", what, i, its[i].key, got.Decisions[i], want.Decisions[i])
			}
		}
		for _, k := range names {
			a, err1 := Apply(c, st, bucket.Peek, at, drip.Request{Key: pa + k, Limit: limits[k]})
			s, err2 := Apply(c, st, bucket.Peek, at, drip.Request{Key: ps + k, Limit: limits[k]})
			if err := errors.Join(err1, err2); err != nil {
				t.Fatal(err)
			}
			if a != s {
				t.Errorf("after %s, %s: one by one left %+v, one step %+v", what, k, s, a)
			}
		}
		return got
	}
	free := func(what, k string, want int64) {
		t.Helper()
		d, err := Apply(c, st, bucket.Peek, at, drip.Request{Key: ps + k, Limit: limits[k]})
		if err != nil || d.Remaining != want {
			t.Errorf("%s: %s has %d free (%v), want %d", what, k, d.Remaining, err, want)
		}
	}

	if m := step("an allowed multi-take", bucket.Take, item{key: "c", lease: "L0"}, item{key: "tb", cost: 1}, item{key: "r", cost: 1}); !m.Allowed {
		t.Fatalf("the first multi-take: %+v", m)
	}
	step("a release", bucket.Refund, item{key: "c", lease: "L0"})
	// The bucket r is empty: the slot of c is taken, then given back.
	if m := step("a lease beside an empty bucket", bucket.Take, item{key: "c", lease: "L1"}, item{key: "r", cost: 1}); m.Allowed || !m.Decisions[0].Allowed {
		t.Errorf("a lease beside an empty bucket: %+v, want denied by the bucket", m)
	}
	free("after a lease beside an empty bucket was denied", "c", 1)
	free("after a lease beside an empty bucket was denied", "r", 0)
	step("every kind, denied by the last", bucket.Take,
		item{key: "tb", cost: 1}, item{key: "d", lease: "A"}, item{key: "c", lease: "L2"}, item{key: "r", cost: 1})
	free("after a denial by the last", "tb", 2)
	free("after a denial by the last", "d", 2)
	free("after a denial by the last", "c", 1)
	step("denied in the middle", bucket.Take, item{key: "tb", cost: 2}, item{key: "r", cost: 1}, item{key: "d", lease: "B"})
	free("after a denial in the middle", "tb", 2)
	at = at.Add(time.Minute) // r has a token again, tb 3
	if m := step("every kind, allowed", bucket.Take,
		item{key: "c", lease: "L3"}, item{key: "tb", cost: 1}, item{key: "r", cost: 1}, item{key: "d", lease: "C"}); !m.Allowed {
		t.Fatalf("every kind, a minute later: %+v", m)
	}
	// c is held by L3: d is taken, then given back.
	step("denied by a held slot", bucket.Take, item{key: "d", lease: "D"}, item{key: "c", lease: "L4"})
	free("after a denial by a held slot", "d", 1)
	step("a multi-peek", bucket.Peek, item{key: "d", lease: "E"}, item{key: "tb", cost: 2}, item{key: "c"})
	step("a multi-release", bucket.Refund, item{key: "c", lease: "L3"}, item{key: "d", lease: "C"}, item{key: "tb", cost: 1})
	free("after the multi-release", "c", 1)
	free("after the multi-release", "d", 2)
}
