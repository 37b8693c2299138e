package engine

import (
	"context"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/driplimit/drip"
	"github.com/driplimit/drip/bucket"
	"github.com/driplimit/drip/store/memstore"
	"github.com/driplimit/drip/storetest"
)

// TestBeforeTakeIsThePeek holds BeforeTake to the store itself: the
// decision of a take that was allowed on its own but not applied (another
// key of the multi-take denied), turned by BeforeTake, is what a peek of
// cost 0 reports at that instant, tokens, remaining and time to fill, on
// every kind of refill.
func TestBeforeTakeIsThePeek(t *testing.T) {
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(15, 1))
	t0 := time.Unix(1_000_000, 0)
	checked := 0
	for i := range 2000 {
		l := drip.Per(float64(1+rng.IntN(20))/float64(1+rng.IntN(4)), time.Duration(1+rng.IntN(5000))*time.Millisecond)
		l = l.WithBurst(float64(1+rng.IntN(40)) / float64(1+rng.IntN(3)))
		switch rng.IntN(3) {
		case 1:
			l = l.WithRefill(drip.Interval)
		case 2:
			l = l.Window()
		}
		s := memstore.New(memstore.WithSweep(0))
		at := t0
		// Some history: takes at random instants.
		for range rng.IntN(6) {
			at = at.Add(time.Duration(rng.IntN(3000)) * time.Millisecond)
			storetest.Apply(ctx, s, bucket.Take, at, drip.Request{Key: "a", Limit: l, Cost: float64(rng.IntN(100)) / 10})
		}
		at = at.Add(time.Duration(rng.IntN(3000)) * time.Millisecond)
		cost := float64(rng.IntN(1+int(Burst(l)*10))) / 10
		deny := drip.Request{Key: "b", Limit: drip.PerHour(1), Cost: 1}
		storetest.Apply(ctx, s, bucket.Take, at, deny) // b's one token is gone: b denies
		m, err := drip.Apply(ctx, s, bucket.Take, at, []drip.Request{{Key: "a", Limit: l, Cost: cost}, deny}...)
		if err != nil {
			t.Fatal(err)
		}
		if m.Allowed || !m.Decisions[0].Allowed {
			s.Close()
			continue // a denied on its own: nothing to turn
		}
		got := beforeTake(m.Decisions[0], PlanOf("", l), "a", cost)
		want, err := storetest.Apply(ctx, s, bucket.Peek, at, drip.Request{Key: "a", Limit: l, Cost: 0})
		s.Close()
		if err != nil {
			t.Fatal(err)
		}
		checked++
		if got.Tokens != want.Tokens || got.Remaining != want.Remaining || got.ResetAfter != want.ResetAfter {
			t.Fatalf("case %d, %v cost %v: BeforeTake %+v, peek %+v", i, l, cost, got, want)
		}
	}
	if checked < 500 {
		t.Fatalf("only %d of 2000 cases had a take to turn", checked)
	}
}
