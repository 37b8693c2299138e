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
	f := fleet{
		slow: func(ms *memstore.Store) store.Store { return batched{ms, 40 * time.Millisecond} },
		// Every 2 s the callers stall for half a second.
		stall: func(since time.Duration) time.Duration { return max(0, 500*time.Millisecond-since%(2*time.Second)) },
		run:   10 * time.Second,
	}
	plain, _, _, _ := f.decide(t, false)
	leasedN, _, _, ls := f.decide(t, true)
	t.Logf("decided: plain %d, leased %d (%+v)", plain, leasedN, ls)
	if leasedN < plain*9/10 {
		t.Errorf("leased instances decided %d takes on a saturated key, plain ones %d: want at least 90%%", leasedN, plain)
	}
}

// fleet is a run of 4 instances of 16 callers on a saturated key (200 a
// second) of a memory store reached through slow (a store of the test's):
// each caller takes every millisecond until the run ends, and stalls as
// long as stall (nil: never) says at the time since the run's start.
// drained: the bucket's burst taken before the run.
type fleet struct {
	slow    func(*memstore.Store) store.Store
	stall   func(since time.Duration) time.Duration
	drained bool
	run     time.Duration
}

// decide runs f, the instances leased or not: the takes decided and
// granted, the time from the run's start to the last decision, and the
// leased instances' stats added up.
func (f fleet) decide(t *testing.T, leasedOn bool) (decided, granted int64, took time.Duration, stats leased.Stats) {
	synctest.Test(t, func(t *testing.T) {
		ms := memstore.New(memstore.WithSweep(0))
		defer ms.Close()
		st := f.slow(ms)
		p, err := drip.PerSecond(200).Params("k")
		if err != nil {
			t.Fatal(err)
		}
		var it bucket.Prepared
		if err := store.Prepare(&it, bucket.Take, "k", &p, 1, false, ""); err != nil {
			t.Fatal(err)
		}
		if f.drained {
			whole := it
			whole.Cost = p.Burst
			res := make([]bucket.Result, 1)
			if err := ms.Apply(context.Background(), bucket.Take, time.Time{}, []bucket.Prepared{whole}, res); err != nil || !res[0].Allowed {
				t.Fatalf("the burst taken: %+v, %v", res[0], err)
			}
		}
		const instances, callers, gap = 4, 16, time.Millisecond
		start := time.Now()
		stop := start.Add(f.run)
		var wg sync.WaitGroup
		var mu sync.Mutex
		var lss []*leased.Store
		for range instances {
			var inst = st
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
						if f.stall != nil {
							if d := f.stall(time.Since(start)); d > 0 {
								time.Sleep(d)
								continue
							}
						}
						if err := inst.Apply(context.Background(), bucket.Take, time.Time{}, []bucket.Prepared{it}, res); err != nil {
							t.Error(err)
							return
						}
						mu.Lock()
						decided++
						if res[0].Allowed {
							granted++
						}
						mu.Unlock()
						time.Sleep(gap)
					}
				})
			}
		}
		wg.Wait()
		took = time.Since(start)
		for _, ls := range lss {
			s := ls.Stats()
			stats.Decisions += s.Decisions
			stats.StoreCalls += s.StoreCalls
			stats.Fetched += s.Fetched
			stats.Local += s.Local
		}
	})
	return decided, granted, took, stats
}

// serial is a store that serves one call at a time, each for service:
// its round trip grows with the calls out, as a loaded database's does.
type serial struct {
	store.Store
	service time.Duration
	turn    chan struct{} // a channel, not a mutex: synctest's time moves on while callers wait on it
}

func (s serial) Apply(ctx context.Context, op bucket.Op, at time.Time, items []bucket.Prepared, results []bucket.Result) error {
	s.turn <- struct{}{}
	defer func() { <-s.turn }()
	time.Sleep(s.service)
	return s.Store.Apply(ctx, op, at, items, results)
}

// TestSaturatedKeySlowStore: on a saturated key (200 a second, its burst
// taken, asked far more) whose store's round trip grows with the calls
// out, a leased fleet asks the store far less than once a decision and
// decides at least as many takes as a plain one. 4 instances of 16
// callers, a take every millisecond each, share a store that serves a
// call at a time in 250 µs (4,000 calls a second: 16 ms a round trip with
// 64 calls out). The callers took their own store call whenever the
// store's last denial no longer held, and a denial holds one token's time
// (5 ms) from its send: every answer came back with its proof over, and
// the fleet made a store call a decision (the collapse of
// BenchmarkLeasedPostgres on a saturated key, one run in three, at 0.59
// of a plain instance). Now a probe's answer decides the callers that
// waited for it.
func TestSaturatedKeySlowStore(t *testing.T) {
	f := fleet{
		slow: func(ms *memstore.Store) store.Store {
			return serial{ms, 250 * time.Microsecond, make(chan struct{}, 1)}
		},
		drained: true,
		run:     2 * time.Second,
	}
	plain, _, _, _ := f.decide(t, false)
	leasedN, granted, took, ls := f.decide(t, true)
	t.Logf("decided: plain %d, leased %d, %d granted in %v (%+v)", plain, leasedN, granted, took, ls)
	if calls := float64(ls.StoreCalls) / float64(ls.Decisions); calls > 0.25 {
		t.Errorf("leased instances made %.2f store calls a decision on a saturated key; want at most 0.25", calls)
	}
	if leasedN < plain*9/10 {
		t.Errorf("leased instances decided %d takes on a saturated key, plain ones %d: want at least 90%%", leasedN, plain)
	}
	// 200 a second from an empty bucket: what refilled until the last
	// decision.
	if bound := int64(took * 200 / time.Second); granted > bound {
		t.Errorf("leased instances granted %d takes in %v at 200 a second, burst taken: over %d", granted, took, bound)
	}
}

// TestSaturatedKeyRoomyAnswers: on a saturated key (200 a second, its
// burst taken, asked far more) whose store's round trip (20 ms, as
// through PgBouncer) refills more tokens than the instances' probes take,
// a leased fleet decides at least 90% of what a plain one does, and
// grants no more than the bucket refilled. 4 instances of 16 callers, a
// take every millisecond each. A fifth of the probes came back granted
// with room for more, and at each such answer every caller waiting took
// on its own, a round trip more: the leased fleet decided 0.75-0.89 of the
// plain one (BenchmarkLeasedPgBouncer's second mode, one run in three).
// Now the callers an answer with room leaves undecided wait for the next
// probe, which went out a reach after the last while they waited.
func TestSaturatedKeyRoomyAnswers(t *testing.T) {
	f := fleet{
		slow:    func(ms *memstore.Store) store.Store { return slow{ms, 20 * time.Millisecond} },
		drained: true,
		run:     2 * time.Second,
	}
	plain, _, _, _ := f.decide(t, false)
	leasedN, granted, took, ls := f.decide(t, true)
	t.Logf("decided: plain %d, leased %d (%.2fx), %d granted in %v, %.3f store calls a decision (%+v)",
		plain, leasedN, float64(leasedN)/float64(plain), granted, took, float64(ls.StoreCalls)/float64(ls.Decisions), ls)
	if leasedN < plain*9/10 {
		t.Errorf("leased instances decided %d takes on a saturated key, plain ones %d: want at least 90%%", leasedN, plain)
	}
	if bound := int64(took * 200 / time.Second); granted > bound {
		t.Errorf("leased instances granted %d takes in %v at 200 a second, burst taken: over %d", granted, took, bound)
	}
}
