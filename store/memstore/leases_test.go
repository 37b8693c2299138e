package memstore

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/driplimit/drip"
	"github.com/driplimit/drip/bucket"
)

// TestLeaseSetModel holds the lease sets (two heaps and a map) to the
// list model of package bucket (Leases, EvalLeases, NextLeases) over
// random steps: up to 40 leases on a key, two TTLs (a limit that changes),
// times that mostly move on but now and then step back or land
// exactly on an expiry, and a shard bound
// of a few sets, so that sets are evicted and swept too.
func TestLeaseSetModel(t *testing.T) {
	for seed := range uint64(20) {
		rng := rand.New(rand.NewPCG(seed, 3))
		s := New(WithSweep(0), WithMaxKeys(256*3))
		var ps [2]bucket.Params
		for i, ttl := range []time.Duration{10 * time.Second, 3 * time.Second} {
			p, err := drip.InFlight(30, ttl).Params("k")
			if err != nil {
				t.Fatal(err)
			}
			ps[i] = p
		}
		key := held("k")
		sh, _ := s.locate(key)
		var model []bucket.Holder
		now := int64(1_700_000_000) * 1e9
		ops := []bucket.Op{bucket.Take, bucket.Take, bucket.Take, bucket.Refund, bucket.Peek}
		for step := range 3000 {
			switch d := rng.Int64N(100); {
			case d < 5:
				now -= rng.Int64N(int64(5 * time.Second))
			case d < 15 && len(model) > 0:
				now = model[rng.IntN(len(model))].Exp // exactly on an expiry
			default:
				now += rng.Int64N(int64(time.Second))
			}
			p := &ps[rng.IntN(2)]
			op := ops[rng.IntN(len(ops))]
			id := fmt.Sprint("l", rng.IntN(40))
			if op == bucket.Peek && rng.IntN(2) == 0 {
				id = ""
			}
			sh.mu.Lock()
			got := sh.leaseSet(key).summary(id, now)
			want := bucket.Leases(model, id, now)
			if got != want {
				sh.mu.Unlock()
				t.Fatalf("seed %d step %d: %v %q: summary %+v, want %+v", seed, step, op, id, got, want)
			}
			if _, write := p.EvalLeases(op, want, id, now); write {
				s.writeLeases(sh, key, p, op, id, now)
				model = p.NextLeases(op, model, id, now)
			}
			if ls := sh.leaseSet(key); ls != nil && ls.exp != bucket.LeasesExpireAt(model) {
				t.Fatalf("seed %d step %d: set expires at %d, want %d", seed, step, ls.exp, bucket.LeasesExpireAt(model))
			} else if ls == nil && len(model) > 0 {
				t.Fatalf("seed %d step %d: no set, want %d leases", seed, step, len(model))
			}
			sh.mu.Unlock()
		}
	}
}

// TestLeaseEviction: a shard at its bound drops the sets that expired,
// then the one whose leases expire first; the sweep drops expired sets.
func TestLeaseEviction(t *testing.T) {
	s := New(WithSweep(0), WithMaxKeys(256*2))
	at := time.Unix(1_700_000_000, 0)
	// Three keys of one shard: a (expires at +10 s), b (+20 s), then c.
	var keys []string
	sh0, _ := s.locate(held("k0"))
	for i := 0; len(keys) < 3; i++ {
		if sh, _ := s.locate(held(fmt.Sprint("k", i))); sh == sh0 {
			keys = append(keys, fmt.Sprint("k", i))
		}
	}
	take := func(key string, at time.Time, ttl time.Duration) {
		t.Helper()
		d, err := drip.Apply(t.Context(), s, bucket.Take, at, drip.Request{Key: key, Limit: drip.InFlight(1, ttl), Lease: "a"})
		if err != nil || !d.Allowed {
			t.Fatal(d, err)
		}
	}
	take(keys[0], at, 10*time.Second)
	take(keys[1], at, 20*time.Second)
	take(keys[2], at, 30*time.Second) // evicts keys[0], the first to expire
	sh0.mu.Lock()
	if sh0.leaseSet(held(keys[0])) != nil || sh0.leaseSet(held(keys[1])) == nil || sh0.leaseCount() != 2 {
		t.Errorf("after the third key: %d sets, the first one kept: %v", sh0.leaseCount(), sh0.leaseSet(held(keys[0])) != nil)
	}
	sh0.mu.Unlock()
	if n := s.Sweep(at.Add(20*time.Second + SweepMargin)); n != 1 {
		t.Errorf("sweep dropped %d, want 1 (the second key)", n)
	}
	if n := s.Len(); n != 1 {
		t.Errorf("%d sets left, want 1", n)
	}
}
