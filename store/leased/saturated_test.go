package leased_test

import (
	"context"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/driplimit/drip"
	"github.com/driplimit/drip/bucket"
	"github.com/driplimit/drip/store"
	"github.com/driplimit/drip/store/leased"
	"github.com/driplimit/drip/store/memstore"
)

// batched is a store that decides the calls of each period at once, at
// its end, as a store that batches its calls into one statement a round
// trip does (PostgreSQL): the first take of a period sees the tokens
// refilled since the last one, and its answer shows what is left.
type batched struct {
	store.Store
	period time.Duration
}

func (b batched) Apply(ctx context.Context, op bucket.Op, at time.Time, items []bucket.Prepared, results []bucket.Result) error {
	now := time.Now()
	time.Sleep(now.Truncate(b.period).Add(b.period).Sub(now))
	return b.Store.Apply(ctx, op, at, items, results)
}

// TestSaturatedKeyAsPlain: on a saturated key (200 a second, asked far
// more) leasing serves nothing, and a leased fleet must decide as many
// takes as a plain one. 4 instances share a store that decides the calls
// of each 40 ms at once (as PostgreSQL's batches do), 16 callers each, a
// take every millisecond, for 10 s; every 2 s the callers stall for half
// a second (a loaded machine), and the bucket refills meanwhile. Blocks
// of half the tokens the store's last answer showed, fetched while the
// key drains, made the callers queue for them, granted at the limit's
// pace instead of denied at once: the leased fleet decided 84% of
// the plain one's takes. Now a key whose store answer shows fewer tokens than two full
// blocks takes no block, and its takes are plain ones until it has
// tokens again.
func TestSaturatedKeyAsPlain(t *testing.T) {
	plain, _ := saturatedRun(t, false)
	leasedN, ls := saturatedRun(t, true)
	t.Logf("decided: plain %d, leased %d (%+v)", plain, leasedN, ls)
	if leasedN < plain*9/10 {
		t.Errorf("leased instances decided %d takes on a saturated key, plain ones %d: want at least 90%%", leasedN, plain)
	}
}

// saturatedRun is a run of TestSaturatedKeyAsPlain: the takes decided,
// and the leased instances' stats added up.
func saturatedRun(t *testing.T, leasedOn bool) (decided int64, stats leased.Stats) {
	synctest.Test(t, func(t *testing.T) {
		ms := memstore.New(memstore.WithSweep(0))
		defer ms.Close()
		st := batched{ms, 40 * time.Millisecond}
		p, err := drip.PerSecond(200).Params("k")
		if err != nil {
			t.Fatal(err)
		}
		var it bucket.Prepared
		if err := store.Prepare(&it, bucket.Take, "k", &p, 1, false, ""); err != nil {
			t.Fatal(err)
		}
		const instances, callers, gap, run = 4, 16, time.Millisecond, 10 * time.Second
		const stall, pause = 2 * time.Second, 500 * time.Millisecond
		start := time.Now()
		stop := start.Add(run)
		var wg sync.WaitGroup
		var mu sync.Mutex
		var lss []*leased.Store
		for range instances {
			var inst store.Store = st
			if leasedOn {
				ls, err := leased.New(st, leased.LeaseInProcess())
				if err != nil {
					t.Fatal(err)
				}
				defer ls.Close()
				lss = append(lss, ls)
				inst = ls
			}
			for range callers {
				wg.Go(func() {
					res := make([]bucket.Result, 1)
					for time.Now().Before(stop) {
						if d := time.Since(start) % stall; d < pause {
							time.Sleep(pause - d) // a stall
							continue
						}
						if err := inst.Apply(context.Background(), bucket.Take, time.Time{}, []bucket.Prepared{it}, res); err != nil {
							t.Error(err)
							return
						}
						mu.Lock()
						decided++
						mu.Unlock()
						time.Sleep(gap)
					}
				})
			}
		}
		wg.Wait()
		for _, ls := range lss {
			s := ls.Stats()
			stats.Decisions += s.Decisions
			stats.StoreCalls += s.StoreCalls
			stats.Fetched += s.Fetched
			stats.Local += s.Local
		}
	})
	return decided, stats
}
