package storetest

import (
	"errors"
	"testing"

	"github.com/driplimit/drip"
	"github.com/driplimit/drip/bucket"
	"github.com/driplimit/drip/store"
)

// RunRounding checks that costs round up to whole micro-tokens, so that no
// cost is free (a cost of 0.0000001 had rounded to 0), that a cost of at
// most six decimals is exact, and that refunds round the same way, giving
// back exactly what a take of the same cost took.
func RunRounding(t *testing.T, newStore NewStore) {
	st := newStore(t)
	c := ctx(t)
	p := prefix()
	at := base()
	lim := drip.PerHour(1).WithBurst(2)
	steps := []struct {
		op   bucket.Op
		cost float64
		want float64 // tokens after
	}{
		{bucket.Take, 0.0000001, 1.999999},
		{bucket.Take, 0.0000015, 1.999997},
		{bucket.Take, 1.1, 0.899997},
		{bucket.Peek, 0.0000001, 0.899996},
		{bucket.Refund, 0.0000001, 0.899998},
		{bucket.Refund, 0.0000015, 0.9},
	}
	for i, s := range steps {
		d, err := Apply(c, st, s.op, at, drip.Request{Key: p + "r", Limit: lim, Cost: s.cost})
		if err != nil || !d.Allowed || d.Tokens != s.want {
			t.Fatalf("step %d: %v of %v: %+v, %v; want %v tokens", i, s.op, s.cost, d, err, s.want)
		}
	}

	// Tiny costs are not free: a bucket of 5 micro-tokens passes five
	// takes of 0.0000001, not fifty.
	tiny := drip.PerHour(0.000001).WithBurst(0.000005)
	for i := range 6 {
		d, err := Apply(c, st, bucket.Take, at, drip.Request{Key: p + "tiny", Limit: tiny, Cost: 0.0000001})
		if err != nil || d.Allowed != (i < 5) {
			t.Fatalf("take %d of 0.0000001 from 5 micro-tokens: %+v, %v; want allowed %v", i, d, err, i < 5)
		}
	}

	// In a multi-take too (where the store can hold both keys together).
	m, err := drip.Apply(c, st, bucket.Take, at, []drip.Request{
		{Key: p + "m1", Limit: lim, Cost: 0.0000001}, {Key: p + "m2", Limit: lim, Cost: 0.0000001}}...)
	switch {
	case errors.Is(err, store.ErrNotColocated):
	case err != nil || !m.Allowed || len(m.Decisions) != 2 || m.Decisions[0].Tokens != 1.999999 || m.Decisions[1].Tokens != 1.999999:
		t.Fatalf("multi-take of 0.0000001 each: %+v, %v; want 1.999999 tokens each", m, err)
	}
}
