package leased_test

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/driplimit/drip"
	"github.com/driplimit/drip/bucket"
	"github.com/driplimit/drip/store"
	"github.com/driplimit/drip/store/leased"
	"github.com/driplimit/drip/store/memstore"
)

// TestSwitchForgetsBlocks: a hot token bucket's key whose limit becomes a
// sliding window (a rules reload) has its bucket replaced in the store,
// blocks and all (docs/semantics.md, "When a limit changes"). When the
// key turns back into the token bucket, it starts afresh in the store,
// and the instance must not grant from the block it held before: at one
// instant, the key grants one burst, not a burst and the old block's
// leftover.
func TestSwitchForgetsBlocks(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ms := memstore.New(memstore.WithSweep(0))
		defer ms.Close()
		ls, err := leased.New(ms, leased.LeaseInProcess())
		if err != nil {
			t.Fatal(err)
		}
		defer ls.Close()
		tb := drip.PerSecond(2000).WithBurst(400)
		take := func(lim drip.Limit) bool {
			t.Helper()
			p, err := lim.Params("k")
			if err != nil {
				t.Fatal(err)
			}
			var it bucket.Prepared
			if err := store.Prepare(&it, bucket.Take, "k", &p, 1, false, ""); err != nil {
				t.Fatal(err)
			}
			var res [1]bucket.Result
			if err := ls.Apply(context.Background(), bucket.Take, time.Time{}, []bucket.Prepared{it}, res[:]); err != nil {
				t.Fatal(err)
			}
			synctest.Wait() // a block fetched in the background has landed
			return res[0].Allowed
		}
		// Hot: takes every 100 µs until the instance holds a block.
		for i := 0; ls.Outstanding("k") == 0; i++ {
			if i == 10000 {
				t.Fatal("the instance never leased a block of the hot key")
			}
			take(tb)
			time.Sleep(100 * time.Microsecond)
		}
		if !take(drip.Limit{Algorithm: drip.SlidingWindow, Rate: 10, Period: time.Minute}) {
			t.Fatal("the sliding window's first take was denied")
		}
		granted := 0
		for range 1000 {
			if take(tb) {
				granted++
			}
		}
		if granted != 400 {
			t.Errorf("at one instant after the switch back, %d takes granted, want 400 (the burst of a fresh bucket)", granted)
		}
	})
}
