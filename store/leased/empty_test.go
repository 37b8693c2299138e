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

// TestEmptyBucketProbed: once a hot key's bucket is short of a take,
// the takes of an instance that come while one of them is out wait for
// its answer, which decides them as the store would have right after it:
// here a grant that left less than a token, so a denial each, the tokens
// and waits those of a take the store decided at that instant. One store
// call for 4 takes. Before, each took on its own (4 calls at once); on a
// store whose round trip was longer than one token's time every take of
// a saturated key was a store call (TestSaturatedKeySlowStore).
func TestEmptyBucketProbed(t *testing.T) {
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
		var it bucket.Prepared
		if err := store.Prepare(&it, bucket.Take, "k", &p, 1, false, ""); err != nil {
			t.Fatal(err)
		}
		take := func(st store.Store, at time.Time) (bucket.Result, error) {
			var res [1]bucket.Result
			err := st.Apply(context.Background(), bucket.Take, at, []bucket.Prepared{it}, res[:])
			return res[0], err
		}
		// Empty the bucket: blocks, then the store's denials.
		denied := 0
		for range 200 {
			r, err := take(ls, time.Now())
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
			if _, err := take(ls, time.Now()); err != nil {
				t.Fatal(err)
			}
			synctest.Wait()
		}
		time.Sleep(60 * time.Millisecond) // past any denial repeated; 1.2 tokens back
		synctest.Wait()
		g.shut.Store(true)
		const callers = 4
		at := time.Now()
		var wg sync.WaitGroup
		var mu sync.Mutex
		var got []bucket.Result
		for range callers {
			wg.Go(func() {
				r, err := take(ls, at)
				if err != nil {
					t.Error(err)
				}
				mu.Lock()
				got = append(got, r)
				mu.Unlock()
			})
		}
		synctest.Wait()
		out := g.waiting.Load()
		g.shut.Store(false)
		close(g.gate)
		wg.Wait()
		if out != 1 {
			t.Errorf("%d of %d takes of an empty bucket reached the store at once; want 1 (the others decided by its answer)", out, callers)
		}
		want, err := take(ms, at) // the store's answer right after
		if err != nil {
			t.Fatal(err)
		}
		allowed := 0
		for _, r := range got {
			switch {
			case r.Allowed:
				allowed++
			case r != want:
				t.Errorf("a take decided by another's grant: %+v; the store answers %+v", r, want)
			}
		}
		if allowed != 1 || want.Allowed {
			t.Errorf("%d of %d takes granted with 1.2 tokens back (the store then: %+v); want 1", allowed, callers, want)
		}
	})
}
