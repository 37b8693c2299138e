package bucket

import (
	"math"
	"testing"
	"time"
)

func TestLeaseExp(t *testing.T) {
	p := Params{Kind: Concurrency, Burst: 2 * Micro, Period: int64(time.Second)}
	for _, c := range []struct{ now, want int64 }{
		{0, 1e9},
		{1, 1e9 + 1000},     // rounded up to a whole microsecond
		{999, 1e9 + 1000},   //
		{1000, 1e9 + 1000},  // exact
		{-1500, 1e9 - 1000}, // before the epoch: up is towards +inf
		{math.MaxInt64 - 10, math.MaxInt64 / 1000 * 1000}, // saturates
	} {
		if got := p.LeaseExp(c.now); got != c.want {
			t.Errorf("LeaseExp(%d) = %d, want %d", c.now, got, c.want)
		}
	}
}

func TestEvalLeases(t *testing.T) {
	p := Params{Kind: Concurrency, Burst: 2 * Micro, Period: 100}
	ls := []Holder{{"a", 1000}, {"b", 500}, {"old", 50}}
	s := Leases(ls, "a", 60)
	if s != (LeaseSet{Live: 2, Held: true, Earliest: 500, Latest: 1000}) {
		t.Fatalf("Leases = %+v", s)
	}
	// c is denied: two live leases, two slots; retry when b expires.
	r, w := p.EvalLeases(Take, Leases(ls, "c", 60), "c", 60)
	if r.Allowed || w || r.RetryAfter != 440 || r.Tokens != 0 || r.ResetAfter != 940 {
		t.Errorf("take c: %+v write %v", r, w)
	}
	// a renews: allowed, written, its expiry moved; old dropped.
	r, w = p.EvalLeases(Take, s, "a", 60)
	if !r.Allowed || !w || r.Tokens != 0 {
		t.Errorf("take a again: %+v write %v", r, w)
	}
	next := p.NextLeases(Take, ls, "a", 60)
	if len(next) != 2 || next[0].ID != "a" || next[1] != (Holder{"b", 500}) {
		t.Errorf("NextLeases after renewing a: %+v", next)
	}
	if next[0].Exp != p.LeaseExp(60) {
		t.Errorf("renewed a expires at %d, want %d", next[0].Exp, p.LeaseExp(60))
	}
	// Release of b: one slot free; of an unknown lease: allowed, nothing.
	r, w = p.EvalLeases(Refund, Leases(ls, "b", 60), "b", 60)
	if !r.Allowed || !w || r.Tokens != Micro {
		t.Errorf("release b: %+v write %v", r, w)
	}
	if n := p.NextLeases(Refund, ls, "b", 60); len(n) != 1 || n[0].ID != "a" {
		t.Errorf("NextLeases after releasing b: %+v", n)
	}
	r, _ = p.EvalLeases(Refund, Leases(ls, "zz", 60), "zz", 60)
	if !r.Allowed || r.Tokens != 0 {
		t.Errorf("release of an unknown lease: %+v", r)
	}
	// At 1000 every lease has expired: a peek without a lease sees two
	// free slots and writes nothing.
	r, w = p.EvalLeases(Peek, Leases(ls, "", 1000), "", 1000)
	if !r.Allowed || w || r.Tokens != 2*Micro || r.ResetAfter != 0 {
		t.Errorf("peek at 1000: %+v write %v", r, w)
	}
}
