package leased_test

import (
	"context"
	"testing"
	"time"

	"github.com/driplimit/drip"
	"github.com/driplimit/drip/bucket"
	"github.com/driplimit/drip/store"
	"github.com/driplimit/drip/store/leased"
	"github.com/driplimit/drip/store/memstore"
)

// TestInProcessPassesThrough: over the memory store, which decides in
// the process, the wrapper passes every call to it as it is: the same
// decisions as the store alone, take by take, no block taken and nothing
// counted (leasing there would save no call and cost its bookkeeping).
func TestInProcessPassesThrough(t *testing.T) {
	wrapped, alone := memstore.New(memstore.WithSweep(0)), memstore.New(memstore.WithSweep(0))
	defer wrapped.Close()
	defer alone.Close()
	ls, err := leased.New(wrapped)
	if err != nil {
		t.Fatal(err)
	}
	defer ls.Close()
	ctx := context.Background()
	at := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	p, err := drip.PerSecond(1000).WithBurst(500).Params("hot")
	if err != nil {
		t.Fatal(err)
	}
	var it bucket.Prepared
	if err := store.Prepare(&it, bucket.Take, "hot", &p, 1, false, ""); err != nil {
		t.Fatal(err)
	}
	for i := range 2000 {
		at = at.Add(100 * time.Microsecond) // 10,000 a second: hot, then saturated
		var got, want [1]bucket.Result
		if err := ls.Apply(ctx, bucket.Take, at, []bucket.Prepared{it}, got[:]); err != nil {
			t.Fatal(err)
		}
		if err := alone.Apply(ctx, bucket.Take, at, []bucket.Prepared{it}, want[:]); err != nil {
			t.Fatal(err)
		}
		if got != want {
			t.Fatalf("take %d: wrapped %+v, alone %+v", i, got[0], want[0])
		}
	}
	if st := ls.Stats(); st != (leased.Stats{}) {
		t.Errorf("stats over the memory store: %+v, want none", st)
	}
	if o := ls.Outstanding("hot"); o != 0 {
		t.Errorf("%d micro-tokens in blocks, want none", o)
	}
}
