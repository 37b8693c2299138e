package engine

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/driplimit/drip"
	"github.com/driplimit/drip/bucket"
	"github.com/driplimit/drip/store"
	"github.com/driplimit/drip/store/memstore"
)

// TestPlanIsApply holds the engine's store calls, which hand the store
// each item's compiled params (Item.Params) with its cost in fixed point,
// to drip.Apply, which prepares every request from its Limit: the same
// decisions, at the same instants, for every kind of limit, including
// those whose params depend on the key (a fixed window without Start) or
// the time (a calendar window), and for items of one key whose costs add
// up past the burst.
func TestPlanIsApply(t *testing.T) {
	limits, ctx, rng := planLimits(t), context.Background(), rand.New(rand.NewPCG(26, 1))
	at := time.Date(2026, 3, 28, 22, 59, 0, 0, time.UTC) // a minute before midnight in Paris
	e, _, viaApply := twoStores(t, &at)
	leaseIDs := []string{store.NewLeaseID(), store.NewLeaseID(), store.NewLeaseID(), store.NewLeaseID()}
	for step := range 3000 {
		at = at.Add(time.Duration(rng.IntN(90)) * time.Millisecond)
		l := limits[rng.IntN(len(limits))]
		_, err := l.Params("")
		if err != nil {
			t.Fatal(err)
		}
		keys := []string{"a", "b", "c"}[:1+rng.IntN(3)]
		var items []*Item
		var reqs []drip.Request
		for _, k := range keys {
			key := l.String() + "/" + k
			cost := float64(rng.IntN(30)) / 4
			lease := ""
			if l.Algorithm == drip.Concurrency {
				// A slot a take (one of a few IDs, so that refunds
				// release some), at most one item a key.
				lease, cost = leaseIDs[rng.IntN(len(leaseIDs))], float64(rng.IntN(5))
			}
			items = append(items, &Item{Key: key, Limit: l, Plan: PlanOf("", l), Cost: cost, Lease: lease, ask: cost})
			if rng.IntN(4) == 0 && lease == "" { // a second item of the key: the costs add up
				extra := float64(rng.IntN(30)) / 4
				items = append(items, &Item{Key: key, Limit: l, Plan: PlanOf("", l), Cost: extra, ask: extra})
				cost += extra
			}
			reqs = append(reqs, drip.Request{Key: key, Limit: l, Cost: cost, Lease: lease})
		}
		op := bucket.Take
		if rng.IntN(5) == 0 {
			op = bucket.Refund
		}
		over := make([]bool, len(reqs))
		for i := range reqs {
			if reqs[i].Cost > Burst(l) {
				// A bucket over its burst: the whole call is a peek (a
				// refund stays one) at the burst, and that bucket denies.
				over[i], reqs[i].Cost = true, Burst(l)
				if op == bucket.Take {
					op = bucket.Peek
				}
			}
		}
		if err := e.step(ctx, e.timeout, defaultBreaker, opOf(op == bucket.Refund), items); err != nil {
			t.Fatal(err)
		}
		want, err := drip.Apply(ctx, viaApply, op, at, reqs...)
		if err != nil {
			t.Fatal(err)
		}
		for _, it := range items {
			j := slicesIndex(reqs, it.Key)
			w := want.Decisions[j]
			if over[j] && op == bucket.Peek {
				w.Allowed = false
			}
			if !it.Decided || it.Decision != w || it.Taken != reqs[j].Cost || it.Changed != (op == bucket.Refund || (op == bucket.Take && want.Allowed)) {
				t.Fatalf("step %d, %v %v, key %s: %+v (taken %v, changed %v), drip.Apply's %+v", step, op, l, it.Key, it.Decision, it.Taken, it.Changed, w)
			}
		}
	}
}

// planLimits are a limit of every kind, a keyed and a calendar window
// among them.
func planLimits(t *testing.T) []drip.Limit {
	paris, err := time.LoadLocation("Europe/Paris")
	if err != nil {
		t.Fatal(err)
	}
	return []drip.Limit{
		drip.PerSecond(10).WithBurst(20),
		drip.Per(3, time.Minute).WithRefill(drip.Interval),
		drip.Per(5, time.Second).Window(),
		{Algorithm: drip.FixedWindow, Rate: 5, Period: 7 * time.Second, Start: 3 * time.Second},
		{Algorithm: drip.SlidingWindow, Rate: 6, Period: 10 * time.Second, Slots: 5},
		{Algorithm: drip.FixedWindow, Rate: 40, Calendar: "day", Location: paris},
		drip.InFlight(3, 5*time.Second),
	}
}

// twoStores is an engine on a memory store (viaPlan) at the time *at,
// and a second memory store to compare it with (viaApply).
func twoStores(t *testing.T, at *time.Time) (e *Engine, viaPlan, viaApply *memstore.Store) {
	viaPlan, viaApply = memstore.New(memstore.WithSweep(0)), memstore.New(memstore.WithSweep(0))
	e = New(viaPlan, WithClock(func() time.Time { return *at }))
	t.Cleanup(func() { e.Close(); viaPlan.Close(); viaApply.Close() })
	return e, viaPlan, viaApply
}

// opOf is the op step is asked for: a refund, else a take.
func opOf(refund bool) bucket.Op {
	if refund {
		return bucket.Refund
	}
	return bucket.Take
}

func slicesIndex(reqs []drip.Request, key string) int {
	for i, r := range reqs {
		if r.Key == key {
			return i
		}
	}
	panic("no request of key " + key)
}

// TestPlanErrors: the engine's store call reports a request's problems as
// drip.Apply does (the key, then the cost, then the lease), without
// calling the store.
func TestPlanErrors(t *testing.T) {
	ms := memstore.New()
	defer ms.Close()
	e := New(ms)
	defer e.Close()
	l := drip.PerSecond(10)
	slots := drip.InFlight(2, time.Minute)
	long := strings.Repeat("k", store.MaxKeyLen+1)
	for _, c := range []struct {
		name string
		item Item
		want error
	}{
		{"no key, bad cost", Item{Limit: l, Plan: PlanOf("", l), Cost: math.NaN()}, store.ErrMissingKey},
		{"long key", Item{Key: long, Limit: l, Plan: PlanOf("", l), Cost: 1}, store.ErrKeyTooLong},
		{"bad cost, bad lease", Item{Key: "a", Limit: l, Plan: PlanOf("", l), Cost: math.Inf(1), Lease: "x"}, store.ErrInvalidCost},
		{"a lease on a bucket", Item{Key: "a", Limit: l, Plan: PlanOf("", l), Cost: 1, Lease: "x"}, store.ErrInvalidLease},
		{"a take of a slot without a lease", Item{Key: "a", Limit: slots, Plan: PlanOf("", slots), Cost: 1}, store.ErrInvalidLease},
	} {
		err := e.DecideItems(context.Background(), []Applied{{Item: c.item}}).Err
		r := c.item
		_, want := drip.Apply(context.Background(), ms, bucket.Take, time.Time{}, drip.Request{Key: r.Key, Limit: r.Limit, Cost: r.Cost, Lease: r.Lease})
		if !errors.Is(err, c.want) || !errors.Is(want, c.want) || err.Error() != want.Error() {
			t.Errorf("%s: %v, drip.Apply's %v, want %v", c.name, err, want, c.want)
		}
		if !store.IsInput(err) {
			t.Errorf("%s: %v is not an input error", c.name, err)
		}
	}
}

// TestPlacedWindowsAllocate holds a decision on a window placed by its key
// (a fixed window without Start) or by the time (a calendar window) to
// the allocations of one on a token bucket: the plan places the window
// itself, without drip.Apply's requests, decisions and params cache.
func TestPlacedWindowsAllocate(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts under the race detector, whose sync.Pool drops items")
	}
	ms := memstore.New(memstore.WithSweep(0))
	defer ms.Close()
	at := time.Date(2026, 3, 28, 22, 59, 0, 0, time.UTC)
	e := New(ms, WithClock(func() time.Time { return at }))
	defer e.Close()
	ctx := context.Background()
	allocs := func(l drip.Limit) float64 {
		pl := PlanOf("r", l)
		return testing.AllocsPerRun(200, func() {
			at = at.Add(time.Millisecond)
			e.DecideItems(ctx, []Applied{{Item: Item{Key: "k", Limit: l, Cost: 1, Plan: pl}}})
		})
	}
	base := allocs(drip.PerSecond(1e6))
	for _, l := range []drip.Limit{
		drip.Per(1e6, time.Second).Window(),
		drip.PerDayIn(1e9, time.UTC),
	} {
		if got := allocs(l); got > base {
			t.Errorf("%v: %v allocations a decision, a token bucket's %v", l, got, base)
		}
	}
}

// TestApplyPlansIsApply holds applyPlans, the engine's give-backs and
// charges prepared by each request's plan, to drip.Apply: the same
// errors, decisions and buckets after, for every kind of limit, a keyed
// and a calendar window among them, with a charge's debt bound, a bad
// cost or two requests of one key now and then.
func TestApplyPlansIsApply(t *testing.T) {
	limits, ctx, rng := planLimits(t), context.Background(), rand.New(rand.NewPCG(37, 3))
	at := time.Date(2026, 3, 28, 22, 59, 0, 0, time.UTC) // a minute before midnight in Paris
	e, viaPlan, viaApply := twoStores(t, &at)
	leaseIDs := []string{store.NewLeaseID(), store.NewLeaseID()}
	for step := range 2000 {
		at = at.Add(time.Duration(rng.IntN(90)) * time.Millisecond)
		l := limits[rng.IntN(len(limits))]
		pl := PlanOf("", l)
		var reqs []drip.Request
		var plans []*Plan
		for _, k := range []string{"a", "b", "c"}[:1+rng.IntN(3)] {
			r := drip.Request{Key: l.String() + "/" + k, Limit: l, Cost: float64(rng.IntN(30)) / 4}
			if l.Algorithm == drip.Concurrency {
				r.Lease, r.Cost = leaseIDs[rng.IntN(len(leaseIDs))], float64(rng.IntN(2))
			}
			if rng.IntN(4) == 0 && l.Algorithm != drip.Concurrency {
				r = chargeReq(r.Key, l, pl, r.Cost) // a settlement's charge: its debt bound
			}
			switch rng.IntN(40) {
			case 0:
				r.Cost = math.NaN()
			case 1:
				r.Key = "" // a bad key
			}
			reqs, plans = append(reqs, r), append(plans, pl)
		}
		if rng.IntN(40) == 0 {
			reqs, plans = append(reqs, reqs[0]), append(plans, pl)
		}
		op := bucket.Take
		if rng.IntN(3) == 0 {
			op = bucket.Refund
		}
		ds, got := e.applyPlans(ctx, e.timeout, defaultBreaker, op, reqs, plans)
		m, want := drip.Apply(ctx, viaApply, op, at, reqs...)
		if fmt.Sprint(got) != fmt.Sprint(want) || !slices.Equal(ds, m.Decisions) {
			t.Fatalf("step %d, %v %v: %+v, error %v; drip.Apply's %+v, %v", step, op, l, ds, got, m.Decisions, want)
		}
		for _, r := range reqs {
			if r.Key == "" {
				continue
			}
			peek := drip.Request{Key: r.Key, Limit: l}
			g, err1 := drip.Apply(ctx, viaPlan, bucket.Peek, at, peek)
			w, err2 := drip.Apply(ctx, viaApply, bucket.Peek, at, peek)
			if err1 != nil || err2 != nil || g.Decisions[0] != w.Decisions[0] {
				t.Fatalf("step %d, %v %v, key %s: %+v (%v), drip.Apply's %+v (%v)", step, op, l, r.Key, g, err1, w, err2)
			}
		}
	}
}

// recorder is a store that keeps the items of its last call.
type recorder struct {
	store.Store
	items []bucket.Prepared
}

func (r *recorder) Apply(ctx context.Context, op bucket.Op, at time.Time, items []bucket.Prepared, res []bucket.Result) error {
	r.items = slices.Clone(items)
	return r.Store.Apply(ctx, op, at, items, res)
}

// TestApplyIsApply holds Engine.Apply, whose requests are prepared by
// plans (a nil one compiled for the call: an inline limit of the
// decision API), and Prepare with Prepared.Apply, which decide prepared
// requests in parts, to drip.Apply: the same errors (a multi-take of one
// names its request), the same items handed to the store, params and
// debt bound included, and the same decisions, for every kind of limit,
// a keyed and a calendar window, and a limit that is not valid among
// them, across midnight in Paris.
func TestApplyIsApply(t *testing.T) {
	limits, ctx, rng := planLimits(t), context.Background(), rand.New(rand.NewPCG(37, 7))
	limits = append(limits, drip.Limit{Rate: -1}, drip.Limit{Rate: 5, Period: time.Second, Burst: 2, MaxReserved: 3})
	at := time.Date(2026, 3, 28, 22, 59, 0, 0, time.UTC) // a minute before midnight in Paris
	ms := []*memstore.Store{memstore.New(memstore.WithSweep(0)), memstore.New(memstore.WithSweep(0)), memstore.New(memstore.WithSweep(0))}
	viaPlan, viaApply, viaCheck := &recorder{Store: ms[0]}, &recorder{Store: ms[1]}, ms[2]
	e := New(viaPlan, WithClock(func() time.Time { return at }))
	t.Cleanup(func() {
		e.Close()
		for _, m := range ms {
			m.Close()
		}
	})
	leaseIDs := []string{store.NewLeaseID(), store.NewLeaseID()}
	for step := range 3000 {
		at = at.Add(time.Duration(rng.IntN(90)) * time.Millisecond)
		var reqs []drip.Request
		var plans []*Plan
		for _, k := range []string{"a", "b", "c"}[:1+rng.IntN(3)] {
			l := limits[rng.IntN(len(limits))]
			r := drip.Request{Key: l.String() + "/" + k, Limit: l, Cost: float64(rng.IntN(30)) / 4, Reserve: rng.IntN(5) == 0}
			if l.Algorithm == drip.Concurrency {
				r.Lease, r.Cost, r.Reserve = leaseIDs[rng.IntN(len(leaseIDs))], float64(rng.IntN(2)), false
			}
			switch rng.IntN(40) {
			case 0:
				r.Cost = math.NaN()
			case 1:
				r.Key = "" // a bad key
			}
			var pl *Plan // an inline limit's: compiled for the call
			if rng.IntN(2) == 0 {
				pl = PlanOf("rule", l) // a rule's
			}
			reqs, plans = append(reqs, r), append(plans, pl)
		}
		if rng.IntN(40) == 0 {
			reqs, plans = append(reqs, reqs[0]), append(plans, plans[0])
		}
		op := []bucket.Op{bucket.Take, bucket.Peek, bucket.Refund}[rng.IntN(3)]
		var got, want error
		var gm, wm drip.Multi
		switch parts := rng.IntN(3); {
		case parts == 0:
			wm, want = drip.Apply(ctx, viaApply, op, at, reqs...)
			gm, got = e.Apply(ctx, op, reqs, plans)
		default:
			multi := rng.IntN(2) == 0
			_, want = drip.Apply(ctx, viaCheck, op, at, reqs...) // its errors, on a store not compared
			if multi && len(reqs) == 1 && want != nil {
				want = fmt.Errorf("requests[0]: %w", want)
			}
			var p *Prepared
			if p, got = e.Prepare(op, reqs, plans, multi); got != nil || want != nil {
				break
			}
			// In parts: the first request, then the others, each part
			// as drip.Apply decides it, at a time of its own.
			idx := []int{0}
			if parts == 2 || len(reqs) == 1 {
				idx = nil // all at once
			}
			for _, part := range [][]drip.Request{reqs[:len(idx)], reqs[len(idx):]} {
				if idx == nil {
					part = reqs
				}
				if len(part) == 0 {
					break
				}
				wm, want = drip.Apply(ctx, viaApply, op, at, part...)
				gm, got = p.Apply(ctx, op, idx)
				if fmt.Sprint(got) != fmt.Sprint(want) || fmt.Sprint(gm) != fmt.Sprint(wm) {
					break
				}
				if idx == nil {
					break
				}
				at = at.Add(time.Duration(rng.IntN(90)) * time.Millisecond)
				if rng.IntN(4) == 0 {
					at = at.Add(time.Duration(rng.IntN(48)) * time.Hour) // a wait: a calendar window ends
				}
				idx = nil
				for i := 1; i < len(reqs); i++ {
					idx = append(idx, i)
				}
			}
		}
		wantItems := viaApply.items
		if fmt.Sprint(got) != fmt.Sprint(want) || fmt.Sprint(gm) != fmt.Sprint(wm) {
			t.Fatalf("step %d, %v %v: %+v, error %v; drip.Apply's %+v, %v", step, op, reqs, gm, got, wm, want)
		}
		if want == nil && fmt.Sprint(viaPlan.items) != fmt.Sprint(wantItems) {
			t.Fatalf("step %d, %v: items %+v, drip.Apply's %+v", step, op, viaPlan.items, wantItems)
		}
	}
}
