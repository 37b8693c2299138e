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

// slow is a store whose every call takes rtt (a loaded database).
type slow struct {
	store.Store
	rtt time.Duration
}

func (s slow) Apply(ctx context.Context, op bucket.Op, at time.Time, items []bucket.Prepared, results []bucket.Result) error {
	time.Sleep(s.rtt)
	return s.Store.Apply(ctx, op, at, items, results)
}

// TestSlowStoreHotKey: a hot key on a store slower than the horizon (a
// call takes 150 ms, the horizon is 100 ms) is still decided at its
// callers' pace. Blocks of a horizon's demand would run out before the
// next one came, the callers would wait for it, the demand they show
// would fall and the next block be smaller still: a block holds the
// demand of a few round trips of the store instead.
func TestSlowStoreHotKey(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ms := memstore.New(memstore.WithSweep(0))
		defer ms.Close()
		ls, err := leased.New(slow{ms, 150 * time.Millisecond}, leased.LeaseInProcess())
		if err != nil {
			t.Fatal(err)
		}
		defer ls.Close()
		p, err := drip.PerSecond(1e8).WithBurst(1e7).Params("k")
		if err != nil {
			t.Fatal(err)
		}
		var it bucket.Prepared
		if err := store.Prepare(&it, bucket.Take, "k", &p, 1, false, ""); err != nil {
			t.Fatal(err)
		}
		// 16 callers, each a take every millisecond at most: 16,000 a
		// second while answers come at once, for 10 s (the first blocks
		// are small: the key's demand and the store's pace are learned).
		const callers, gap, run = 16, time.Millisecond, 10 * time.Second
		var decided atomic.Int64
		stop := time.Now().Add(run)
		var wg sync.WaitGroup
		for range callers {
			wg.Go(func() {
				res := make([]bucket.Result, 1)
				for time.Now().Before(stop) {
					if err := ls.Apply(context.Background(), bucket.Take, time.Time{}, []bucket.Prepared{it}, res); err != nil {
						t.Error(err)
						return
					}
					decided.Add(1)
					time.Sleep(gap)
				}
			})
		}
		wg.Wait()
		most := int64(callers * run / gap)
		if n := decided.Load(); n < most*2/3 {
			t.Errorf("%d takes decided in %v, want at least 2/3 of %d (%+v)", n, run, most, ls.Stats())
		}
	})
}
