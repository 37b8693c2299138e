package engine

import (
	"context"
	"testing"
	"time"

	"github.com/driplimit/drip"
	"github.com/driplimit/drip/bucket"
	"github.com/driplimit/drip/store/memstore"
)

// TestItemOutcomeRecycledAllocates: an outcome of DecideItems handed back with
// Recycle is not allocated again by the next call, and carries nothing of
// the call before: after a denial (its reason, wait and events) handed
// back, an allowed call answers as on an engine that never recycles.
func TestItemOutcomeRecycledAllocates(t *testing.T) {
	at := time.Date(2026, 11, 29, 8, 0, 0, 0, time.UTC)
	clock := func() time.Time { return at }
	ctx := context.Background()
	wide, narrow := drip.PerSecond(1e6), drip.Limit{Rate: 1, Period: time.Hour, Burst: 1}
	item := func(key string, l drip.Limit) Applied {
		return Applied{Item: Item{Key: key, Limit: l, Cost: 1, Plan: PlanOf(key, l)}}
	}
	var got, want []*Outcome
	for _, recycle := range []bool{true, false} {
		ms := memstore.New(memstore.WithSweep(0))
		defer ms.Close()
		e := New(ms, WithClock(clock))
		defer e.Close()
		for i := range 4 {
			// Two takes of narrow: the second is denied, both items
			// with it; then wide alone, allowed.
			as := []Applied{item("n", narrow), item("w", wide)}
			if i == 3 {
				as = as[1:]
			}
			out := e.DecideItems(ctx, as)
			snap := &Outcome{Allowed: out.Allowed, Reason: out.Reason, RetryAfter: out.RetryAfter,
				Identity: out.Identity, Err: out.Err, Applied: append([]Applied(nil), out.Applied...)}
			if recycle {
				got = append(got, snap)
				out.Recycle()
			} else {
				want = append(want, snap)
			}
		}
	}
	for i := range got {
		g, w := got[i], want[i]
		if g.Allowed != w.Allowed || g.Reason != w.Reason || g.RetryAfter != w.RetryAfter || g.Identity != w.Identity ||
			g.Err != w.Err || len(g.Applied) != len(w.Applied) {
			t.Fatalf("call %d: recycled %+v, fresh %+v", i, g, w)
		}
		for j := range g.Applied {
			if g.Applied[j].Event != w.Applied[j].Event || g.Applied[j].Decision != w.Applied[j].Decision {
				t.Errorf("call %d item %d: recycled %v %+v, fresh %v %+v", i, j,
					g.Applied[j].Event, g.Applied[j].Decision, w.Applied[j].Event, w.Applied[j].Decision)
			}
		}
	}
	if want[1].Allowed || !want[3].Allowed {
		t.Fatalf("the sequence did not deny then allow: %+v", want)
	}

	if raceEnabled {
		t.Skip("allocation counts under the race detector, whose sync.Pool drops items")
	}
	ms := memstore.New(memstore.WithSweep(0))
	defer ms.Close()
	e := New(ms, WithClock(clock))
	defer e.Close()
	as := []Applied{item("a", wide), item("b", wide)}
	kept := testing.AllocsPerRun(200, func() { e.DecideItems(ctx, as) })
	recycled := testing.AllocsPerRun(200, func() { e.DecideItems(ctx, as).Recycle() })
	if recycled > kept-1 {
		t.Errorf("%v allocations a call with Recycle, %v without: want one fewer (the outcome)", recycled, kept)
	}
}

// TestScratchFreedHoldsNothing: a scratch back in the pool holds none of
// its last caller's items or keys, whatever sizes its uses had (free
// clears what a use wrote, not the whole capacity).
func TestScratchFreedHoldsNothing(t *testing.T) {
	sc := &scratch{reqs: make([]stepReq, 0, 4), items: make([]bucket.Prepared, 4), res: make([]bucket.Result, 4)}
	for _, n := range []int{6, 2, 1, 9, 3} {
		for range n {
			sc.reqs = append(sc.reqs, stepReq{it: &Item{Key: "k"}, cost: 1})
		}
		items, _ := sc.sized(n)
		for j := range items {
			items[j].Key = "key"
		}
		sc.plans = append(sc.plans, &Plan{})
		sc.free()
		for j, r := range sc.reqs[:cap(sc.reqs)] {
			if r.it != nil {
				t.Fatalf("after a use of %d: reqs[%d] still holds an item", n, j)
			}
		}
		for j, it := range sc.items[:cap(sc.items)] {
			if it.Key != "" {
				t.Fatalf("after a use of %d: items[%d] still holds key %q", n, j, it.Key)
			}
		}
		if len(sc.plans) != 0 || cap(sc.plans) > 0 && sc.plans[:1][0] != nil {
			t.Fatalf("after a use of %d: plans held", n)
		}
	}
}

// TestFieldsAllocateOnce: the header values of an outcome of several
// limits are one string cut into its fields, whatever the numbers (above
// the small ones strconv keeps): one allocation, and the same text as
// the fields written one by one.
func TestFieldsAllocateOnce(t *testing.T) {
	at := time.Date(2026, 11, 29, 8, 0, 0, 0, time.UTC)
	ms := memstore.New(memstore.WithSweep(0))
	defer ms.Close()
	e := New(ms, WithClock(func() time.Time { return at }))
	defer e.Close()
	a := drip.Limit{Rate: 1000, Period: time.Hour, Burst: 1000}
	b := drip.Limit{Rate: 500, Period: time.Minute, Burst: 700}
	out := e.DecideItems(context.Background(), []Applied{
		{Item: Item{Key: "a", Limit: a, Cost: 1, Plan: PlanOf("a", a)}},
		{Item: Item{Key: "b", Limit: b, Cost: 1, Plan: PlanOf("b", b)}}})
	f := out.Fields()
	want := Fields{Policy: `"a";q=1000;w=3600, "b";q=700;w=84`, RateLimit: `"a";r=999;t=4, "b";r=699;t=1`,
		Limit: "700", Remaining: "699", Reset: "1"}
	if f != want {
		t.Fatalf("fields\n%+v, want\n%+v", f, want)
	}
	if raceEnabled {
		t.Skip("allocation counts under the race detector")
	}
	if n := testing.AllocsPerRun(100, func() { out.Fields() }); n != 1 {
		t.Errorf("%v allocations for the fields, want 1", n)
	}
}
