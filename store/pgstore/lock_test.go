package pgstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/driplimit/drip"
	"github.com/driplimit/drip/bucket"
	"github.com/driplimit/drip/store/pgstore"
	"github.com/driplimit/drip/storetest"
)

// TestClockAfterLock: on the server's clock, a statement that waited for a
// bucket's row lock decides at the time it got the lock, not when it
// started (ts must never run backwards, and the waiter must see the refill
// of the wait). Holds for the single take, the multi-take and the batch.
func TestClockAfterLock(t *testing.T) {
	lim := drip.PerSecond(10)
	for _, path := range []string{"take", "multi", "batch"} {
		t.Run(path, func(t *testing.T) {
			st := newStore(t, pgstore.WithoutBatching())
			ctx := context.Background()
			key := prefix() + "locked"
			if d, err := storetest.Apply(ctx, st, bucket.Take, time.Time{}, drip.Request{Key: key, Limit: lim, Cost: 10}); err != nil || !d.Allowed {
				t.Fatalf("drain: %+v %v", d, err)
			}
			tx, err := pool(t).Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer tx.Rollback(ctx)
			if _, err := tx.Exec(ctx, "SELECT 1 FROM drip.buckets WHERE key = $1 FOR UPDATE", pgstore.StoreKey(key)); err != nil {
				t.Fatal(err)
			}
			type out struct {
				d   drip.Decision
				err error
			}
			done := make(chan out, 1)
			req := drip.Request{Key: key, Limit: lim, Cost: 3}
			go func() {
				var o out
				switch path {
				case "take":
					o.d, o.err = storetest.Apply(ctx, st, bucket.Take, time.Time{}, req)
				case "multi":
					var m drip.Multi
					m, o.err = drip.Apply(ctx, st, bucket.Take, time.Time{}, []drip.Request{req, {Key: key + "-other", Limit: lim, Cost: 1}}...)
					if o.err == nil {
						o.d = m.Decisions[0]
					}
				case "batch":
					ds, errs := pgstore.ApplyBatch(ctx, st, []bucket.Op{bucket.Take}, []drip.Request{req}, []time.Time{{}})
					o.d, o.err = ds[0], errs[0]
				}
				done <- o
			}()
			// The bucket is empty; 400 ms of waiting on the lock refill 4
			// tokens, enough for the 3 the waiter asks.
			time.Sleep(400 * time.Millisecond)
			if err := tx.Commit(ctx); err != nil {
				t.Fatal(err)
			}
			o := <-done
			if o.err != nil || !o.d.Allowed {
				t.Fatalf("after waiting 400 ms on the lock, a take of 3 at 10/s: %+v %v (the clock was read before the lock)", o.d, o.err)
			}
		})
	}
}
