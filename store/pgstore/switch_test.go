package pgstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/driplimit/drip"
	"github.com/driplimit/drip/bucket"
	"github.com/driplimit/drip/storetest"
)

// TestSwitchSweep: a key whose leases a token bucket replaced (a rules
// reload from a concurrency limit to a token bucket) keeps its bucket's
// row while those leases may still be live, even once the bucket has
// expired. Swept, the row would no longer say that the leases are older
// than the bucket, and they would count again when the key turns back
// into a concurrency limit (docs/semantics.md, "When a limit changes").
func TestSwitchSweep(t *testing.T) {
	st := newStore(t)
	ctx := context.Background()
	k := prefix() + "k"
	// Ten minutes ago: the bucket expired long before the sweep margin,
	// and the leases live a day.
	at := time.Now().Add(-10 * time.Minute)
	conc := drip.InFlight(3, 24*time.Hour)
	acquire := func(lease string) int64 {
		t.Helper()
		d, err := storetest.Apply(ctx, st, bucket.Take, at, drip.Request{Key: k, Limit: conc, Lease: lease})
		if err != nil || !d.Allowed {
			t.Fatalf("acquire %s: %+v, %v", lease, d, err)
		}
		return d.Remaining
	}
	if free := acquire("a"); free != 2 {
		t.Fatalf("the first acquire leaves %d slots free, want 2", free)
	}
	if d, err := storetest.Apply(ctx, st, bucket.Take, at, drip.Request{Key: k, Limit: drip.PerSecond(10), Cost: 1}); err != nil || d.Remaining != 9 {
		t.Fatalf("the token bucket's take on the key: %+v, %v; want 9 left (afresh)", d, err)
	}
	if _, err := st.Sweep(ctx); err != nil {
		t.Fatal(err)
	}
	if free := acquire("b"); free != 2 {
		t.Errorf("after the sweep, an acquire leaves %d slots free, want 2: the lease the bucket replaced counted again", free)
	}
}
