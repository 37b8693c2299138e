package memstore_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/driplimit/drip"
	"github.com/driplimit/drip/store/memstore"
	"github.com/driplimit/drip/storetest"
)

func TestConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T) drip.Store {
		s := memstore.New()
		t.Cleanup(func() { s.Close() })
		return s
	})
}

// TestBoundedMemory sends many more distinct keys than the bound allows,
// as an attacker would: the store stays within its bound, and a bucket
// that is far from full survives the flood, which evicts the buckets
// nearest to full first.
func TestBoundedMemory(t *testing.T) {
	const bound = 4096
	s := memstore.New(memstore.WithMaxKeys(bound), memstore.WithSweep(0))
	defer s.Close()
	ctx := context.Background()
	at := time.Unix(1_000_000, 0)
	lim := drip.PerMinute(10)
	// A real user who has spent their whole burst.
	if d, _ := s.Apply(ctx, drip.OpTake, at, drip.Request{Key: "victim", Limit: lim, Cost: 10}); !d.Allowed {
		t.Fatal(d)
	}
	// 200,000 one-off keys, each one token off full.
	for i := range 200_000 {
		if _, err := s.Apply(ctx, drip.OpTake, at, drip.Request{Key: fmt.Sprint("attacker-", i), Limit: lim, Cost: 1}); err != nil {
			t.Fatal(err)
		}
	}
	if n := s.Len(); n > bound+256 {
		t.Fatalf("%d buckets held, bound %d", n, bound)
	}
	d, _ := s.Apply(ctx, drip.OpPeek, at, drip.Request{Key: "victim", Limit: lim, Cost: 1})
	if d.Allowed || d.Tokens != 0 {
		t.Fatalf("the empty bucket was evicted before nearly full ones: %+v", d)
	}
}

func TestSweep(t *testing.T) {
	s := memstore.New(memstore.WithSweep(0))
	defer s.Close()
	ctx := context.Background()
	at := time.Unix(1_000_000, 0)
	s.Apply(ctx, drip.OpTake, at, drip.Request{Key: "short", Limit: drip.PerSecond(1), Cost: 1})
	s.Apply(ctx, drip.OpTake, at, drip.Request{Key: "long", Limit: drip.PerHour(1), Cost: 1})
	if n := s.Sweep(at.Add(memstore.SweepMargin)); n != 0 {
		t.Fatalf("swept %d buckets before any expired a margin ago", n)
	}
	if n := s.Sweep(at.Add(time.Second + memstore.SweepMargin)); n != 1 || s.Len() != 1 {
		t.Fatalf("swept %d, %d left; want the refilled bucket gone and the other kept", n, s.Len())
	}
}
