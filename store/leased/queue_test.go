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

// slowBlocks is a store whose block takes take rtt (queued on a loaded
// database's row lock) and whose other calls answer at once; started is
// closed at the first block take.
type slowBlocks struct {
	store.Store
	rtt     time.Duration
	once    sync.Once
	started chan struct{}
}

func (s *slowBlocks) Apply(ctx context.Context, op bucket.Op, at time.Time, items []bucket.Prepared, results []bucket.Result) error {
	if op == bucket.Take && items[0].Block != "" {
		s.once.Do(func() { close(s.started) })
		time.Sleep(s.rtt)
	}
	return s.Store.Apply(ctx, op, at, items, results)
}

// takeOfK is a take of one token of key k, limited to 1,000 a second,
// and a function that takes it from ls.
func takeOfK(t *testing.T, ls *leased.Store) (bucket.Prepared, func(context.Context) (bucket.Result, error)) {
	p, err := drip.PerSecond(1000).Params("k")
	if err != nil {
		t.Fatal(err)
	}
	var it bucket.Prepared
	if err := store.Prepare(&it, bucket.Take, "k", &p, 1, false, ""); err != nil {
		t.Fatal(err)
	}
	return it, func(ctx context.Context) (bucket.Result, error) {
		res := make([]bucket.Result, 1)
		err := ls.Apply(ctx, bucket.Take, time.Time{}, []bucket.Prepared{it}, res)
		return res[0], err
	}
}

// takeUntil takes, at one instant, until started is closed (a block
// take of the store began), and closes the channel it returns.
func takeUntil(t *testing.T, started <-chan struct{}, take func(context.Context) (bucket.Result, error)) <-chan struct{} {
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-started:
				return
			default:
			}
			if _, err := take(context.Background()); err != nil {
				t.Error(err)
				return
			}
		}
	}()
	return done
}

// TestNoQueueBehindBlockTake: while one caller takes a block of a hot
// key whose bucket is less than half full (a key near its limit, where
// leasing serves little), the instance's other callers of the key are
// decided as without leasing, each by a take of its own, rather than
// queued behind it. They waited for the block take's answer: with a
// store slow to answer block takes (5 s here) every caller with a
// deadline of 1 s failed.
func TestNoQueueBehindBlockTake(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ms := memstore.New(memstore.WithSweep(0))
		defer ms.Close()
		st := &slowBlocks{Store: ms, rtt: 5 * time.Second, started: make(chan struct{})}
		ls, err := leased.New(st, leased.LeaseInProcess())
		if err != nil {
			t.Fatal(err)
		}
		defer ls.Close()
		it, take := takeOfK(t, ls)
		// The bucket less than half full: 600 of its 1,000 taken.
		most := it
		most.Cost = 600 * bucket.Micro
		if err := ms.Apply(context.Background(), bucket.Take, time.Time{}, []bucket.Prepared{most}, make([]bucket.Result, 1)); err != nil {
			t.Fatal(err)
		}
		// Takes at one instant until the key is hot and one of them
		// takes a block (and waits for it).
		first := takeUntil(t, st.started, take)
		<-st.started
		const callers = 10
		var wg sync.WaitGroup
		errs := make(chan error, callers)
		for range callers {
			wg.Go(func() {
				ctx, cancel := context.WithTimeout(context.Background(), time.Second)
				defer cancel()
				r, err := take(ctx)
				if err == nil && !r.Allowed {
					t.Errorf("a take of a bucket far from empty denied: %+v", r)
				}
				errs <- err
			})
		}
		wg.Wait()
		close(errs)
		failed := 0
		for err := range errs {
			if err != nil {
				failed++
			}
		}
		if failed > 0 {
			t.Errorf("%d of %d takes of a hot key failed while a block take was out: want each decided by its own take", failed, callers)
		}
		<-first
	})
}

// TestNoQueueBehindSlowBlockTakeOfFullBucket: while the store's last
// answer showed the bucket at least half full, the callers of a hot key
// that come while the instance's block take is out wait for it, but no
// longer than about two of its usual round trips, and never one after
// another: if it stalls they are decided as without leasing. They waited
// for it up to their deadline, each in turn (through drip serve, a
// block take slow on a loaded PostgreSQL left every caller of the key
// waiting until the engine's stall timer opened its breaker, which then
// answered 503 to every request for its cool-down).
func TestNoQueueBehindSlowBlockTakeOfFullBucket(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st, take := stallAfterFirstBlock(t)
		// Takes at one instant until the key is hot, has a block (its
		// take answered at once), and the next block take stalls.
		takeUntil(t, st.started, take)
		<-st.started
		const callers = 10
		var wg sync.WaitGroup
		var mu sync.Mutex
		failed, slow := 0, 0
		for range callers {
			wg.Go(func() {
				ctx, cancel := context.WithTimeout(context.Background(), time.Second)
				defer cancel()
				start := time.Now()
				r, err := take(ctx)
				if err == nil && !r.Allowed {
					t.Errorf("a take of a bucket far from empty denied: %+v", r)
				}
				mu.Lock()
				defer mu.Unlock()
				if err != nil {
					failed++
				}
				if time.Since(start) > 100*time.Millisecond {
					slow++
				}
			})
		}
		wg.Wait()
		// Again once the slow take has answered, block takes now taking
		// 5 s as a rule: still none waits out its deadline.
		time.Sleep(6 * time.Second)
		for range callers {
			wg.Go(func() {
				ctx, cancel := context.WithTimeout(context.Background(), time.Second)
				defer cancel()
				if _, err := take(ctx); err != nil {
					mu.Lock()
					failed++
					mu.Unlock()
				}
			})
		}
		wg.Wait()
		if failed > 0 || slow > 0 {
			t.Errorf("of %d takes of a hot key, full bucket, while its block take stalled: %d failed, %d waited over 100 ms: want each decided soon by a take of its own", callers, failed, slow)
		}
	})
}

// stallAfterFirstBlock is a leased instance in front of a memory store
// whose first block take answers at once and whose later ones take 5 s
// (slowAfter), and takeOfK's take from it; both close with the test
// (within its bubble).
func stallAfterFirstBlock(t *testing.T) (*slowAfter, func(context.Context) (bucket.Result, error)) {
	ms := memstore.New(memstore.WithSweep(0))
	t.Cleanup(func() { ms.Close() })
	st := &slowAfter{Store: ms, fast: 1, rtt: 5 * time.Second, started: make(chan struct{})}
	ls, err := leased.New(st, leased.LeaseInProcess())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ls.Close() })
	_, take := takeOfK(t, ls)
	return st, take
}

// slowAfter is a store whose first fast block takes answer at once and
// whose later ones take rtt; started is closed at the first slow one.
type slowAfter struct {
	store.Store
	fast    int
	rtt     time.Duration
	mu      sync.Mutex
	started chan struct{}
}

func (s *slowAfter) Apply(ctx context.Context, op bucket.Op, at time.Time, items []bucket.Prepared, results []bucket.Result) error {
	if op == bucket.Take && items[0].Block != "" {
		s.mu.Lock()
		s.fast--
		slow := s.fast < 0
		if s.fast == -1 {
			close(s.started)
		}
		s.mu.Unlock()
		if slow {
			time.Sleep(s.rtt)
		}
	}
	return s.Store.Apply(ctx, op, at, items, results)
}

// TestNoSecondBlockCallBehindStalledFetch: a block fetched ahead of need
// (when the current one is half used) is the key's one block call out.
// While it stalls, a caller that finds the blocks used up waits for it no
// longer than about two block takes' usual time, then is decided as
// without leasing. It sent a block call of its own, which queued behind
// the stalled one on the store (here: took the same 5 s), and waited out
// its deadline.
func TestNoSecondBlockCallBehindStalledFetch(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st, take := stallAfterFirstBlock(t)
		// One caller's takes, one after another at one instant: the key
		// proves hot, its first block comes at once, the next (fetched
		// ahead) stalls, and the takes go on past the first block's end.
		slow := 0
		for range 1500 {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			start := time.Now()
			_, err := take(ctx)
			cancel()
			if err != nil || time.Since(start) > 100*time.Millisecond {
				slow++
			}
		}
		select {
		case <-st.started:
		default:
			t.Fatal("no block take stalled: the test tests nothing")
		}
		if slow > 0 {
			t.Errorf("%d of 1,500 takes failed or waited over 100 ms while the block fetched ahead stalled: want each decided soon", slow)
		}
	})
}
