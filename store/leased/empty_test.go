package leased_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/driplimit/drip"
	"github.com/driplimit/drip/bucket"
	"github.com/driplimit/drip/store"
	"github.com/driplimit/drip/store/leased"
	"github.com/driplimit/drip/store/memstore"
)

// gated is a store whose calls wait at a gate once it is shut, counting
// the calls waiting there.
type gated struct {
	store.Store
	shut    atomic.Bool
	gate    chan struct{}
	waiting atomic.Int32
}

func (g *gated) Apply(ctx context.Context, op bucket.Op, at time.Time, items []bucket.Prepared, results []bucket.Result) error {
	if g.shut.Load() {
		g.waiting.Add(1)
		<-g.gate
	}
	return g.Store.Apply(ctx, op, at, items, results)
}

// TestEmptyBucketNotQueued: once a hot key's bucket is empty, an
// instance holds no block and fetches none, and its takes go to the store
// as they would without leasing: all at once, not one at a time behind a
// single call per key (which made a saturated hot key's callers wait a
// store round trip each and decide at about the limit's rate).
func TestEmptyBucketNotQueued(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ms := memstore.New(memstore.WithSweep(0))
		defer ms.Close()
		g := &gated{Store: ms, gate: make(chan struct{})}
		ls, err := leased.New(g, leased.LeaseInProcess())
		if err != nil {
			t.Fatal(err)
		}
		defer ls.Close()
		lim := drip.PerSecond(20).WithBurst(20)
		p, err := lim.Params("k")
		if err != nil {
			t.Fatal(err)
		}
		take := func() (bucket.Result, error) {
			var it bucket.Prepared
			if err := store.Prepare(&it, bucket.Take, "k", &p, 1, false, ""); err != nil {
				return bucket.Result{}, err
			}
			var res [1]bucket.Result
			err := ls.Apply(context.Background(), bucket.Take, time.Now(), []bucket.Prepared{it}, res[:])
			return res[0], err
		}
		// Empty the bucket: blocks, then the store's denials.
		denied := 0
		for range 200 {
			r, err := take()
			if err != nil {
				t.Fatal(err)
			}
			if !r.Allowed {
				denied++
			}
			synctest.Wait() // the blocks given back and fetched ahead
		}
		if denied == 0 {
			t.Fatal("200 takes on a burst of 20 at once: none denied")
		}
		time.Sleep(time.Second) // a denial repeated no more; 20 tokens back
		synctest.Wait()
		// Drain again, through the store, so the instance knows it is empty.
		for range 40 {
			if _, err := take(); err != nil {
				t.Fatal(err)
			}
			synctest.Wait()
		}
		time.Sleep(200 * time.Millisecond) // past any denial repeated
		synctest.Wait()
		g.shut.Store(true)
		const callers = 4
		var wg sync.WaitGroup
		for range callers {
			wg.Go(func() {
				if _, err := take(); err != nil {
					t.Error(err)
				}
			})
		}
		synctest.Wait()
		got := g.waiting.Load()
		g.shut.Store(false)
		close(g.gate)
		wg.Wait()
		if got != callers {
			t.Errorf("%d of %d takes of an empty bucket reached the store at once; want all (none queued behind another)", got, callers)
		}
	})
}
