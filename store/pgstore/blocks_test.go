package pgstore_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/driplimit/drip"
	"github.com/driplimit/drip/bucket"
	"github.com/driplimit/drip/internal/testkit/testserver"
	"github.com/driplimit/drip/store"
	"github.com/driplimit/drip/store/memstore"
	"github.com/driplimit/drip/store/pgstore"
	"github.com/driplimit/drip/storetest"
)

// TestBlocks holds the blocks of leased limits on PostgreSQL to the exact
// model: one statement a call, with batching on (leased calls bypass the
// batcher) and off, and through PgBouncer in transaction mode: the three
// in parallel, each its own store (keys under prefixes of their own).
// Through the pooler, every scenario and one random trace of the four
// (storetest.RunBlocksTransport): the other three would send the
// batching run's statements to the same server again, with the same
// encodings (see TestPgBouncerConformance).
func TestBlocks(t *testing.T) {
	t.Parallel()
	for _, mode := range []struct {
		name string
		opts []pgstore.Option
	}{
		{"statement", []pgstore.Option{pgstore.WithoutBatching()}},
		{"batching", []pgstore.Option{pgstore.WithBatching(pgstore.Batching{MaxBatch: 64, InFlight: 4})}},
	} {
		t.Run(mode.name, func(t *testing.T) {
			t.Parallel()
			st := newStore(t, mode.opts...)
			storetest.RunBlocks(t, func(t *testing.T) store.Store { return st })
		})
	}
	t.Run("pgbouncer", func(t *testing.T) {
		t.Parallel()
		bouncer := testserver.StartPgBouncer(t, testserver.SharedPostgres(t), 0)
		st := openVia(t, bouncer.URL(), "")
		storetest.RunBlocksTransport(t, func(t *testing.T) store.Store { return st })
	})
}

// leasedItem is an item of a call of TestBlocksMixed.
type leasedItem struct {
	key    string
	lim    drip.Limit
	cost   float64
	lease  string // a concurrency limit's lease
	block  string // a block take or return
	leased bool
}

func prepareLeased(t *testing.T, op bucket.Op, it leasedItem) bucket.Prepared {
	t.Helper()
	p, err := it.lim.Params(it.key)
	if err != nil {
		t.Fatal(err)
	}
	if it.block != "" {
		pr, err := store.PrepareBlock(op, it.key, p, int64(it.cost*bucket.Micro), it.block, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		return pr
	}
	var pr bucket.Prepared
	if err := store.Prepare(&pr, op, it.key, &p, it.cost, false, it.lease); err != nil {
		t.Fatal(err)
	}
	pr.Leased = it.leased
	return pr
}

// TestBlocksMixed: a call that holds a block, or a key with blocks, is
// decided whole by drip.block_apply, whatever else it holds (a plain
// bucket, a concurrency limit), all or nothing; and a key's blocks cap
// every request on it, marked leased or not (its one bucket).
func TestBlocksMixed(t *testing.T) {
	t.Parallel()
	db := pool(t)
	for _, mode := range []struct {
		name string
		opts []pgstore.Option
	}{
		{"statement", []pgstore.Option{pgstore.WithoutBatching()}},
		{"batching", nil},
	} {
		t.Run(mode.name, func(t *testing.T) {
			st := newStore(t, mode.opts...)
			ctx := context.Background()
			p := prefix()
			// Ahead of the server's clock: no sweep of a parallel test
			// drops these rows mid-test.
			at := time.Now().Truncate(time.Hour).Add(time.Hour)
			leasedLim, plainLim := drip.PerSecond(1).WithBurst(5), drip.PerHour(2)
			l := leasedItem{key: p + "L", lim: leasedLim, cost: 1, leased: true}
			plain := leasedItem{key: p + "P", lim: plainLim, cost: 1}
			slot := func(lease string) leasedItem {
				return leasedItem{key: p + "C", lim: drip.InFlight(1, time.Minute), lease: lease}
			}
			call := func(what string, op bucket.Op, want []bool, tokens []float64, its ...leasedItem) {
				t.Helper()
				items := make([]bucket.Prepared, len(its))
				for i, it := range its {
					items[i] = prepareLeased(t, op, it)
				}
				res := make([]bucket.Result, len(items))
				if err := st.Apply(ctx, op, at, items, res); err != nil {
					t.Fatalf("%s: %v", what, err)
				}
				for i := range res {
					d := drip.DecisionOf(res[i], items[i].Params.Burst)
					if d.Allowed != want[i] || d.Tokens != tokens[i] {
						t.Errorf("%s: item %d allowed %v tokens %v, want %v %v", what, i, d.Allowed, d.Tokens, want[i], tokens[i])
					}
				}
			}
			call("all three", bucket.Take, []bool{true, true, true}, []float64{4, 1, 0}, l, plain, slot("a"))
			big := plain
			big.cost = 2
			call("the bucket and the slot deny", bucket.Take, []bool{true, false, false}, []float64{3, 1, 0}, l, big, slot("b"))
			call("nothing was taken (a peek tells what a take would leave)", bucket.Peek, []bool{true, true, true}, []float64{3, 0, 0}, l, plain, slot("a"))
			blk := leasedItem{key: l.key, lim: leasedLim, cost: 3, block: "x"}
			call("a block of 3 beside a take", bucket.Take, []bool{true, true}, []float64{1, 0}, blk, plain)
			notLeased := l
			notLeased.leased = false
			call("the same key, not marked leased: the same bucket, under the block's cap", bucket.Take, []bool{true}, []float64{0}, notLeased)
			call("nor is it alone", bucket.Take, []bool{false}, []float64{0}, notLeased)
			call("the block back with 2 unused, the slot released", bucket.Refund, []bool{true, true}, []float64{2, 1}, leasedItem{key: l.key, lim: leasedLim, cost: 2, block: "x"}, slot("a"))
			call("the slot is free", bucket.Take, []bool{true, true}, []float64{1, 0}, l, slot("b"))
			var rows int
			if err := db.QueryRow(ctx, "SELECT count(*) FROM drip.buckets WHERE key = $1", pgstore.StoreKey(l.key)).Scan(&rows); err != nil || rows != 1 {
				t.Fatalf("%d rows of the leased key (%v), want 1", rows, err)
			}
			if err := st.Reset(ctx, l.key); err != nil {
				t.Fatal(err)
			}
			if err := db.QueryRow(ctx, "SELECT count(*) FROM drip.buckets WHERE key = $1", pgstore.StoreKey(l.key)).Scan(&rows); err != nil || rows != 0 {
				t.Fatalf("after Reset: %d rows of the leased key (%v), want 0", rows, err)
			}
			call("reset: full again", bucket.Peek, []bool{true}, []float64{4}, l)
		})
	}
}

// TestSweepBlocks: the sweeper deletes the rows of keys whose blocks all
// expired and whose bucket is full again, and keeps those with a live
// block.
func TestSweepBlocks(t *testing.T) {
	db := pool(t)
	st := newStore(t)
	ctx := context.Background()
	p := prefix()
	lim := drip.PerSecond(10).WithBurst(20)
	now := time.Now()
	for key, at := range map[string]time.Time{"old": now.Add(-2 * time.Hour), "live": now} {
		it := prepareLeased(t, bucket.Take, leasedItem{key: p + key, lim: lim, cost: 5, block: "b"})
		res := make([]bucket.Result, 1)
		if err := st.Apply(ctx, bucket.Take, at, []bucket.Prepared{it}, res); err != nil || !res[0].Allowed {
			t.Fatalf("%s: %+v, %v", key, res[0], err)
		}
	}
	count := func(key string) int {
		t.Helper()
		var n int
		if err := db.QueryRow(ctx, "SELECT count(*) FROM drip.buckets WHERE key = $1", pgstore.StoreKey(p+key)).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	if count("old") != 1 || count("live") != 1 {
		t.Fatalf("before the sweep: %d old, %d live rows", count("old"), count("live"))
	}
	if _, err := st.Sweep(ctx); err != nil {
		t.Fatal(err)
	}
	if count("old") != 0 || count("live") != 1 {
		t.Fatalf("after the sweep: %d old rows (want 0), %d live (want 1)", count("old"), count("live"))
	}
}

// BenchmarkLeasedTake: one caller's takes of one key, plain and marked
// leased (both take.sql: a key without blocks), and beside 8 live blocks
// of the key (drip.block_apply): the cost of a leased limit's take that
// goes to the store.
func BenchmarkLeasedTake(b *testing.B) {
	for _, c := range []struct {
		name   string
		leased bool
		blocks int
	}{{"plain", false, 0}, {"leased", true, 0}, {"leased/blocks=8", true, 8}} {
		b.Run(c.name, func(b *testing.B) {
			st := newStore(b, pgstore.WithoutBatching())
			ctx := context.Background()
			key := prefix() + "k"
			lim := drip.PerSecond(1e9).WithBurst(1e9)
			p, err := lim.Params(key)
			if err != nil {
				b.Fatal(err)
			}
			res := make([]bucket.Result, 1)
			for i := range c.blocks {
				it, err := store.PrepareBlock(bucket.Take, key, p, bucket.Micro, fmt.Sprint("b", i), time.Minute)
				if err != nil {
					b.Fatal(err)
				}
				if err := st.Apply(ctx, bucket.Take, time.Time{}, []bucket.Prepared{it}, res); err != nil || !res[0].Allowed {
					b.Fatal(res[0], err)
				}
			}
			var it bucket.Prepared
			if err := store.Prepare(&it, bucket.Take, key, &p, 1, false, ""); err != nil {
				b.Fatal(err)
			}
			it.Leased = c.leased
			items := []bucket.Prepared{it}
			b.ResetTimer()
			for range b.N {
				if err := st.Apply(ctx, bucket.Take, time.Time{}, items, res); err != nil || !res[0].Allowed {
					b.Fatal(res[0], err)
				}
			}
		})
	}
}

// TestBlocksLateTakesNothing: a block take whose statement gets its row
// locks after its caller's deadline (drip.buckets locked by another
// session, and a connection that cannot cancel the statement) fails with
// an error that wraps context.DeadlineExceeded and writes nothing.
func TestBlocksLateTakesNothing(t *testing.T) {
	db := pool(t)
	ctx := context.Background()
	st, err := pgstore.New(ctx, uncancellable{db}, pgstore.WithSweep(0))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	key := prefix() + "late"
	lim := drip.PerSecond(1).WithBurst(10)
	tx, err := db.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, "LOCK TABLE drip.buckets IN ACCESS EXCLUSIVE MODE"); err != nil {
		t.Fatal(err)
	}
	c, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		it := prepareLeased(t, bucket.Take, leasedItem{key: key, lim: lim, cost: 4, block: "b"})
		done <- st.Apply(c, bucket.Take, time.Time{}, []bucket.Prepared{it}, make([]bucket.Result, 1))
	}()
	<-c.Done() // the caller gave up; its statement still waits on the lock
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a late block take: %v, want an error wrapping context.DeadlineExceeded", err)
	}
	var rows int
	if err := db.QueryRow(ctx, "SELECT count(*) FROM drip.buckets WHERE key = $1", pgstore.StoreKey(key)).Scan(&rows); err != nil || rows != 0 {
		t.Fatalf("%d rows of the key (%v), want none", rows, err)
	}
	peek := prepareLeased(t, bucket.Peek, leasedItem{key: key, lim: lim, leased: true})
	res := make([]bucket.Result, 1)
	if err := st.Apply(ctx, bucket.Peek, time.Time{}, []bucket.Prepared{peek}, res); err != nil || res[0].Tokens != 10*bucket.Micro {
		t.Fatalf("after the late take: %+v, %v; want the bucket full", res[0], err)
	}
}

// TestBlocksOverSlidingRow: a plain bucket decided by drip.block_apply
// (beside a leased item) on a key whose row holds a sliding window's
// counts reads it as no state, as the plain statements do, and its write
// replaces the row: the window is gone, and the bucket is a bucket.
func TestBlocksOverSlidingRow(t *testing.T) {
	t.Parallel()
	st := newStore(t, pgstore.WithoutBatching())
	ctx := context.Background()
	p := prefix()
	at := time.Now().Truncate(time.Hour).Add(time.Hour)
	window := leasedItem{key: p + "S", lim: drip.Limit{Algorithm: drip.SlidingWindow, Rate: 3, Period: time.Minute}, cost: 1}
	bucketOnS := leasedItem{key: p + "S", lim: drip.PerHour(10), cost: 4}
	l := leasedItem{key: p + "L", lim: drip.PerSecond(1).WithBurst(5), cost: 1, leased: true}
	apply := func(op bucket.Op, its ...leasedItem) []drip.Decision {
		t.Helper()
		return applyLeased(ctx, t, st, op, at, its...)
	}
	apply(bucket.Take, window)
	apply(bucket.Take, window)
	if d := apply(bucket.Take, l, bucketOnS); !d[1].Allowed || d[1].Tokens != 6 {
		t.Fatalf("a bucket of 10 taking 4 on the window's key: %+v; want allowed, 6 left (a fresh bucket)", d[1])
	}
	// A peek tells what a take would leave: 2 of a fresh window of 3 (0
	// had the window's two takes stayed).
	if d := apply(bucket.Peek, window); d[0].Tokens != 2 {
		t.Errorf("the window after the bucket replaced its row: a take would leave %v; want 2 (fresh)", d[0].Tokens)
	}
}

// countedStore is a store on the shared server whose statements db
// counts; it closes when the test ends.
func countedStore(t *testing.T) (*statements, *pgstore.Store) {
	t.Helper()
	db := &statements{Pool: pool(t)}
	st, err := pgstore.New(context.Background(), db, pgstore.WithSweep(0))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return db, st
}

// statements is a pool that counts the statements it runs (Query's),
// and those that call drip.block_apply.
type statements struct {
	*pgxpool.Pool
	blockApply atomic.Int64 // drip.block_apply and drip.block_batch
	queries    atomic.Int64 // every statement run by Query
}

func (s *statements) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	s.queries.Add(1)
	if strings.HasPrefix(sql, "SELECT * FROM drip.block_apply(") || strings.HasPrefix(sql, "SELECT * FROM drip.block_batch(") {
		s.blockApply.Add(1)
	}
	return s.Pool.Query(ctx, sql, args...)
}

// TestLeasedTakeIsPlain: a take marked leased but without a block (a
// leased instance's take on a cold or exhausted key) is a plain take,
// batched as any: no drip.block_apply of its own, on a key without
// blocks or with, where it is held to the blocks' cap.
func TestLeasedTakeIsPlain(t *testing.T) {
	t.Parallel()
	db, st := countedStore(t)
	ctx := context.Background()
	p := prefix()
	at := time.Now().Truncate(time.Hour).Add(time.Hour)
	lim := drip.PerSecond(1).WithBurst(10)
	take := func(it leasedItem) drip.Decision {
		t.Helper()
		items := []bucket.Prepared{prepareLeased(t, bucket.Take, it)}
		res := make([]bucket.Result, 1)
		if err := st.Apply(ctx, bucket.Take, at, items, res); err != nil {
			t.Fatal(err)
		}
		return drip.DecisionOf(res[0], items[0].Params.Burst)
	}
	for range 3 {
		take(leasedItem{key: p + "k", lim: lim, cost: 1, leased: true})
	}
	if n := db.blockApply.Load(); n != 0 {
		t.Fatalf("3 leased takes on a key without blocks ran drip.block_apply %d times, want 0", n)
	}
	take(leasedItem{key: p + "k", lim: lim, cost: 5, block: "b"})
	if d := take(leasedItem{key: p + "k", lim: lim, cost: 3, leased: true}); d.Allowed || d.Tokens != 2 {
		t.Errorf("a take of 3 with 2 left beside a block of 5: %+v; want denied, 2 tokens", d)
	}
	if n := db.blockApply.Load(); n != 1 {
		t.Errorf("a block take and a take on the key with the block: %d block statements, want 1 (the block's)", n)
	}
}

// TestSaturatedKeyWithBlocksBatched: while blocks of a key are out (a hot
// key that leased instances lease), the plain takes on it (an exhausted
// key's, which leased instances send as they are) are decided by the
// batched statements under the blocks' cap, never one drip.block_apply
// each: at most one statement a take, none of them drip.block_apply, and
// exactly the tokens left under the cap granted.
func TestSaturatedKeyWithBlocksBatched(t *testing.T) {
	t.Parallel()
	db, st := countedStore(t)
	ctx := context.Background()
	key := prefix() + "hot"
	at := time.Now().Truncate(time.Hour).Add(time.Hour) // one instant: nothing refills
	lim := drip.PerSecond(200)
	for i, cost := range []float64{20, 10} {
		items := []bucket.Prepared{prepareLeased(t, bucket.Take, leasedItem{key: key, lim: lim, cost: cost, block: fmt.Sprint("b", i)})}
		res := make([]bucket.Result, 1)
		if err := st.Apply(ctx, bucket.Take, at, items, res); err != nil || !res[0].Allowed {
			t.Fatalf("block %d: %+v, %v", i, res[0], err)
		}
	}
	blocks, before := db.blockApply.Load(), db.queries.Load()
	const callers, each = 48, 8
	var granted atomic.Int64
	errs := make(chan error, callers)
	take := prepareLeased(t, bucket.Take, leasedItem{key: key, lim: lim, cost: 1, leased: true})
	for range callers {
		go func() {
			var err error
			for range each {
				items := []bucket.Prepared{take}
				res := make([]bucket.Result, 1)
				if err = st.Apply(ctx, bucket.Take, at, items, res); err != nil {
					break
				}
				if res[0].Allowed {
					granted.Add(1)
				}
			}
			errs <- err
		}()
	}
	for range callers {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if n := db.blockApply.Load() - blocks; n != 0 {
		t.Errorf("%d plain takes on a key with 2 blocks out ran drip.block_apply %d times, want 0 (batched)", callers*each, n)
	}
	if n := db.queries.Load() - before; n > callers*each {
		t.Errorf("%d plain takes on a key with 2 blocks out ran %d statements, want at most one each", callers*each, n)
	}
	if g := granted.Load(); g != 200-30 {
		t.Errorf("%d takes granted of a burst of 200 with blocks of 30 out, want 170", g)
	}
	// The blocks are still out: returned whole, their 30 tokens are
	// all the bucket holds.
	for i, cost := range []float64{20, 10} {
		items := []bucket.Prepared{prepareLeased(t, bucket.Refund, leasedItem{key: key, lim: lim, cost: cost, block: fmt.Sprint("b", i)})}
		res := make([]bucket.Result, 1)
		if err := st.Apply(ctx, bucket.Refund, at, items, res); err != nil {
			t.Fatal(err)
		}
		if d := drip.DecisionOf(res[0], items[0].Params.Burst); d.Tokens != []float64{20, 30}[i] {
			t.Errorf("block %d returned: %v tokens, want %v", i, d.Tokens, []float64{20, 30}[i])
		}
	}
}

// TestBatchBlocksSameAsMemstore: the batched statements decide plain
// requests on keys with blocks (live, expiring between two requests of
// one batch, returned) as the memory store does, bucket.EvalBlocks:
// chains of one key (batch.sql), distinct keys (batch_distinct.sql) and
// batches of one (take.sql), beside block takes and returns.
func TestBatchBlocksSameAsMemstore(t *testing.T) {
	t.Parallel()
	for _, distinct := range []bool{false, true} {
		t.Run(fmt.Sprint("distinct=", distinct), func(t *testing.T) {
			t.Parallel()
			pg := newStore(t, pgstore.WithSweep(0))
			ctx := context.Background()
			for seed := range uint64(3) {
				testBatchBlocks(ctx, t, pg, distinct, seed)
			}
		})
	}
}

func testBatchBlocks(ctx context.Context, t *testing.T, pg *pgstore.Store, distinct bool, seed uint64) {
	mem := memstore.New(memstore.WithSweep(0))
	defer mem.Close()
	rng := rand.New(rand.NewPCG(seed, 36))
	p := prefix()
	keys := []string{p + "a", p + "b", p + "c", p + "d"}
	lims := []drip.Limit{drip.PerSecond(50).WithBurst(20), drip.Per(8, 100*time.Millisecond).Window(),
		drip.PerSecond(100).WithBurst(30), drip.PerSecond(20).WithBurst(6)}
	at := time.Now().Truncate(time.Hour).Add(time.Hour) // ahead of the sweeps of parallel tests
	type out struct {
		key   int
		id    string
		size  float64
		until time.Time
	}
	var blocks []out
	both := func(what string, op bucket.Op, when time.Time, it leasedItem) {
		t.Helper()
		var ds [2]drip.Decision
		for i, st := range []store.Store{pg, mem} {
			items := []bucket.Prepared{prepareLeased(t, op, it)}
			res := make([]bucket.Result, 1)
			if err := st.Apply(ctx, op, when, items, res); err != nil {
				t.Fatalf("seed %d %s: %v", seed, what, err)
			}
			ds[i] = drip.DecisionOf(res[0], items[0].Params.Burst)
		}
		if ds[0] != ds[1] {
			t.Fatalf("seed %d %s:\npostgres %+v\nmemory   %+v", seed, what, ds[0], ds[1])
		}
	}
	runs, blocked := 0, 0
	for step := range 160 {
		at = at.Add(time.Duration(rng.IntN(30)) * time.Millisecond)
		switch x := rng.IntN(10); {
		case x < 2:
			k := rng.IntN(len(keys))
			b := out{k, fmt.Sprint("s", seed, "x", step), float64(1 + rng.IntN(5)), time.Time{}}
			both(fmt.Sprintf("step %d: a block of %v of %s", step, b.size, keys[k]), bucket.Take, at,
				leasedItem{key: keys[k], lim: lims[k], cost: b.size, block: b.id})
			blocks = append(blocks, b)
		case x < 3 && len(blocks) > 0:
			i := rng.IntN(len(blocks))
			b := blocks[i]
			blocks = append(blocks[:i], blocks[i+1:]...)
			unused := float64(rng.IntN(int(b.size) + 1))
			both(fmt.Sprintf("step %d: block %s back with %v unused", step, b.id, unused), bucket.Refund, at,
				leasedItem{key: keys[b.key], lim: lims[b.key], cost: unused, block: b.id})
		default:
			n := 1 + rng.IntN(12)
			var ops []bucket.Op
			var rs []drip.Request
			var ats []time.Time
			seen := map[int]bool{}
			when := at
			for range n {
				k := rng.IntN(len(keys))
				if distinct && seen[k] {
					break
				}
				seen[k] = true
				op := bucket.Take
				switch y := rng.IntN(10); {
				case y == 0:
					op = bucket.Refund
				case y == 1:
					op = bucket.Peek
				}
				when = when.Add(time.Duration(rng.IntN(4)) * time.Millisecond)
				ops = append(ops, op)
				rs = append(rs, drip.Request{Key: keys[k], Limit: lims[k], Cost: float64(1 + rng.IntN(3))})
				ats = append(ats, when)
			}
			at = when
			got, errs := pgstore.ApplyBatch(ctx, pg, ops, rs, ats)
			runs++
			for i := range rs {
				if errs[i] != nil {
					t.Fatalf("seed %d step %d request %d of %d: %v", seed, step, i, len(rs), errs[i])
				}
				want, err := storetest.Apply(ctx, mem, ops[i], ats[i], rs[i])
				if err != nil {
					t.Fatal(err)
				}
				if got[i] != want {
					t.Fatalf("seed %d step %d request %d of %d (%v %+v):\npostgres %+v\nmemory   %+v", seed, step, i, len(rs), ops[i], rs[i], got[i], want)
				}
			}
			if len(blocks) > 0 {
				blocked++
			}
		}
	}
	t.Logf("seed %d: %d batches, %d of them with blocks taken (some expired)", seed, runs, blocked)
}

// TestBlockTakesBatched: concurrent block takes and returns on one key
// (a hot key's, leased by many instances) go through the batcher as
// plain takes do, several in one statement (drip.block_batch), instead of
// one drip.block_apply each queued on the row's lock; and they stay
// exact: of 48 blocks of 5 on a burst of 200 at one instant, exactly 40
// are granted, and returned whole they give the bucket back whole.
func TestBlockTakesBatched(t *testing.T) {
	t.Parallel()
	db, st := countedStore(t)
	ctx := context.Background()
	key := prefix() + "hot"
	at := time.Now().Truncate(time.Hour).Add(time.Hour) // one instant: nothing refills
	lim := drip.PerSecond(200)
	const callers = 48
	run := func(op bucket.Op, ids []string) (granted []string, statements int64) {
		t.Helper()
		before := db.queries.Load()
		start := make(chan struct{})
		type answer struct {
			id  string
			ok  bool
			err error
		}
		answers := make(chan answer, len(ids))
		for _, id := range ids {
			items := []bucket.Prepared{prepareLeased(t, op, leasedItem{key: key, lim: lim, cost: 5, block: id})}
			go func() {
				res := make([]bucket.Result, 1)
				<-start
				err := st.Apply(ctx, op, at, items, res)
				answers <- answer{id, res[0].Allowed, err}
			}()
		}
		close(start)
		for range ids {
			a := <-answers
			if a.err != nil {
				t.Fatal(a.err)
			}
			if a.ok {
				granted = append(granted, a.id)
			}
		}
		return granted, db.queries.Load() - before
	}
	var ids []string
	for i := range callers {
		ids = append(ids, fmt.Sprint("b", i))
	}
	granted, n := run(bucket.Take, ids)
	t.Logf("%d block takes: %d statements", callers, n)
	if len(granted) != 40 {
		t.Errorf("%d blocks of 5 granted of a burst of 200, want 40", len(granted))
	}
	if n > callers/2 {
		t.Errorf("%d concurrent block takes on one key ran %d statements, want at most %d (batched)", callers, n, callers/2)
	}
	_, n = run(bucket.Refund, granted)
	t.Logf("%d block returns: %d statements", len(granted), n)
	if n > int64(len(granted))/2 {
		t.Errorf("%d concurrent block returns on one key ran %d statements, want at most %d (batched)", len(granted), n, len(granted)/2)
	}
	items := []bucket.Prepared{prepareLeased(t, bucket.Peek, leasedItem{key: key, lim: lim, cost: 1})}
	res := make([]bucket.Result, 1)
	if err := st.Apply(ctx, bucket.Peek, at, items, res); err != nil {
		t.Fatal(err)
	}
	if d := drip.DecisionOf(res[0], items[0].Params.Burst); d.Tokens != 199 {
		t.Errorf("every block returned whole, a peek of 1: %v tokens, want 199 (of 200)", d.Tokens)
	}
}

// TestBlockBatchSameAsMemstore: block takes and returns decided in one
// statement (drip.block_batch), chains of one key among them, decide as
// the memory store decides them one after another (bucket.EvalBlocks):
// blocks taken, denied, taken again under a live ID, returned, returned
// twice, expiring within a batch.
func TestBlockBatchSameAsMemstore(t *testing.T) {
	t.Parallel()
	pg := newStore(t, pgstore.WithSweep(0))
	ctx := context.Background()
	for seed := range uint64(3) {
		mem := memstore.New(memstore.WithSweep(0))
		rng := rand.New(rand.NewPCG(seed, 7))
		p := prefix()
		keys := []string{p + "a", p + "b"}
		lims := []drip.Limit{drip.PerSecond(50).WithBurst(20), drip.Per(8, 100*time.Millisecond).Window()}
		at := time.Now().Truncate(time.Hour).Add(time.Hour)
		var ids []string
		for step := range 40 {
			n := 1 + rng.IntN(10)
			ops := make([]bucket.Op, n)
			items := make([]bucket.Prepared, n)
			ats := make([]time.Time, n)
			for i := range n {
				at = at.Add(time.Duration(rng.IntN(40)) * time.Millisecond)
				k := rng.IntN(len(keys))
				it := leasedItem{key: keys[k], lim: lims[k], cost: float64(1 + rng.IntN(6))}
				ops[i] = bucket.Take
				switch {
				case len(ids) > 0 && rng.IntN(3) == 0:
					ops[i], it.block = bucket.Refund, ids[rng.IntN(len(ids))]
				case len(ids) > 0 && rng.IntN(8) == 0:
					it.block = ids[rng.IntN(len(ids))] // a take under a live ID, or one returned
				default:
					it.block = fmt.Sprint("s", seed, "x", step, "i", i)
					ids = append(ids, it.block)
				}
				items[i], ats[i] = prepareLeased(t, ops[i], it), at
			}
			got, errs := pgstore.ApplyCalls(ctx, pg, ops, items, ats)
			for i := range items {
				if errs[i] != nil {
					t.Fatalf("seed %d step %d call %d of %d: %v", seed, step, i, n, errs[i])
				}
				want := make([]bucket.Result, 1)
				if err := mem.Apply(ctx, ops[i], ats[i], items[i:i+1], want); err != nil {
					t.Fatal(err)
				}
				g, w := drip.DecisionOf(got[i], items[i].Params.Burst), drip.DecisionOf(want[0], items[i].Params.Burst)
				if g != w {
					t.Fatalf("seed %d step %d call %d of %d (%v %s %s %d):\npostgres %+v\nmemory   %+v", seed, step, i, n, ops[i], items[i].Key, items[i].Block, items[i].Cost, g, w)
				}
			}
		}
		mem.Close()
	}
}

// blockModes are the ways TestPeekAndMultiWithBlocksPlain and
// TestPeekAndMultiBlocksSameAsMemstore run the store: batched, one
// statement a call, and through PgBouncer in transaction mode.
var blockModes = []blockMode{
	{"batching", false, nil},
	{"statement", false, []pgstore.Option{pgstore.WithoutBatching()}},
	{"pgbouncer", true, nil},
}

type blockMode struct {
	name    string
	bouncer bool
	opts    []pgstore.Option
}

// open is a store of the mode on the shared server, and the count of
// its statements.
func (m blockMode) open(t *testing.T) (*pgstore.Store, *statements) {
	t.Helper()
	db := &statements{Pool: pool(t)} // the schema installed
	if m.bouncer {
		bouncer := testserver.StartPgBouncer(t, testserver.SharedPostgres(t), 0)
		db = &statements{Pool: mustPool(t, bouncer.URL())}
	}
	st, err := pgstore.New(context.Background(), db, append([]pgstore.Option{pgstore.WithSweep(0)}, m.opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st, db
}

// TestPeekAndMultiWithBlocksPlain: peeks and multi-takes on a key whose
// row holds blocks are decided by their own statements (peek.sql,
// multi.sql) under the blocks' cap, one statement a call and no
// drip.block_apply, batched and not, and through PgBouncer.
func TestPeekAndMultiWithBlocksPlain(t *testing.T) {
	t.Parallel()
	for _, mode := range blockModes {
		t.Run(mode.name, func(t *testing.T) {
			t.Parallel()
			st, db := mode.open(t)
			testPeekAndMultiWithBlocks(t, st, db)
		})
	}
}

func testPeekAndMultiWithBlocks(t *testing.T, st *pgstore.Store, db *statements) {
	ctx := context.Background()
	p := prefix()
	hot, cold := p+"hot", p+"cold"
	at := time.Now().Truncate(time.Hour).Add(time.Hour) // one instant: nothing refills
	lim := drip.PerSecond(200)
	apply := func(op bucket.Op, its ...leasedItem) []drip.Decision {
		t.Helper()
		return applyLeased(ctx, t, st, op, at, its...)
	}
	for i, cost := range []float64{20, 10} {
		if d := apply(bucket.Take, leasedItem{key: hot, lim: lim, cost: cost, block: fmt.Sprint("b", i)}); !d[0].Allowed {
			t.Fatalf("block %d: %+v", i, d[0])
		}
	}
	blocks, before := db.blockApply.Load(), db.queries.Load()
	const calls = 10
	for range calls {
		if d := apply(bucket.Peek, leasedItem{key: hot, lim: lim, cost: 1}); !d[0].Allowed || d[0].Tokens != 169 {
			t.Fatalf("a peek of 1 on 200 with blocks of 30 out: %+v, want allowed with 169 tokens", d[0])
		}
	}
	for i := range calls {
		ds := apply(bucket.Take, leasedItem{key: hot, lim: lim, cost: 1}, leasedItem{key: cold, lim: lim, cost: 1})
		if !ds[0].Allowed || ds[0].Tokens != float64(169-i) || !ds[1].Allowed || ds[1].Tokens != float64(199-i) {
			t.Fatalf("multi-take %d of 1 on each key: %+v, want %v and %v tokens", i, ds, 169-i, 199-i)
		}
	}
	ds := apply(bucket.Peek, leasedItem{key: hot, lim: lim, cost: 161}, leasedItem{key: cold, lim: lim, cost: 1})
	if ds[0].Allowed || ds[0].Tokens != 160 || !ds[1].Allowed {
		t.Errorf("a multi-peek of 161 on the key with 160 left under the blocks' cap: %+v, want denied", ds)
	}
	if n := db.blockApply.Load() - blocks; n != 0 {
		t.Errorf("%d peeks and %d multi-takes on a key with 2 blocks out ran drip.block_apply %d times, want 0", calls, calls+1, n)
	}
	if n := db.queries.Load() - before; n > 2*calls+1 {
		t.Errorf("%d peeks and multi-takes on a key with 2 blocks out ran %d statements, want at most one each", 2*calls+1, n)
	}
	// The blocks stayed out through the multi-takes: returned whole,
	// they give back their 30 tokens.
	for i, cost := range []float64{20, 10} {
		if d := apply(bucket.Refund, leasedItem{key: hot, lim: lim, cost: cost, block: fmt.Sprint("b", i)}); d[0].Tokens != []float64{180, 190}[i] {
			t.Errorf("block %d returned: %v tokens, want %v", i, d[0].Tokens, []float64{180, 190}[i])
		}
	}
}

// TestPeekAndMultiBlocksSameAsMemstore: peeks and multi-takes (and
// multi-peeks, multi-refunds) on keys with blocks (live, expiring between
// two calls, returned) decide as the memory store does,
// bucket.EvalBlocks and bucket.EvalMultiAll: batched and not, and
// through PgBouncer.
func TestPeekAndMultiBlocksSameAsMemstore(t *testing.T) {
	t.Parallel()
	for _, mode := range blockModes {
		t.Run(mode.name, func(t *testing.T) {
			t.Parallel()
			pg, _ := mode.open(t)
			for seed := range uint64(3) {
				testPeekMultiBlocks(t, pg, seed)
			}
		})
	}
}

func testPeekMultiBlocks(t *testing.T, pg *pgstore.Store, seed uint64) {
	ctx := context.Background()
	mem := memstore.New(memstore.WithSweep(0))
	defer mem.Close()
	rng := rand.New(rand.NewPCG(seed, 37))
	p := prefix()
	keys := []string{p + "a", p + "b", p + "c", p + "d", p + "e"}
	lims := []drip.Limit{drip.PerSecond(50).WithBurst(20), drip.Per(8, 100*time.Millisecond).Window(),
		drip.PerSecond(100).WithBurst(30), drip.PerSecond(20).WithBurst(6), drip.PerSecond(10).Sliding().WithSlots(4)}
	const leasable = 4                                  // keys[4] is a sliding window: never leased
	at := time.Now().Truncate(time.Hour).Add(time.Hour) // ahead of the sweeps of parallel tests
	type out struct {
		key  int
		id   string
		size float64
	}
	var blocks []out
	both := func(what string, op bucket.Op, its ...leasedItem) {
		t.Helper()
		var ds [2][]drip.Decision
		for i, st := range []store.Store{pg, mem} {
			ds[i] = applyLeased(ctx, t, st, op, at, its...)
		}
		if fmt.Sprint(ds[0]) != fmt.Sprint(ds[1]) {
			t.Fatalf("seed %d %s:\npostgres %+v\nmemory   %+v", seed, what, ds[0], ds[1])
		}
	}
	for step := range 160 {
		at = at.Add(time.Duration(rng.IntN(40)) * time.Millisecond)
		switch x := rng.IntN(10); {
		case x < 2:
			k := rng.IntN(leasable)
			b := out{k, fmt.Sprint("s", seed, "x", step), float64(1 + rng.IntN(5))}
			both(fmt.Sprintf("step %d: a block of %v of %s", step, b.size, keys[k]), bucket.Take,
				leasedItem{key: keys[k], lim: lims[k], cost: b.size, block: b.id})
			blocks = append(blocks, b)
		case x < 3 && len(blocks) > 0:
			i := rng.IntN(len(blocks))
			b := blocks[i]
			blocks = append(blocks[:i], blocks[i+1:]...)
			unused := float64(rng.IntN(int(b.size) + 1))
			both(fmt.Sprintf("step %d: block %s back with %v unused", step, b.id, unused), bucket.Refund,
				leasedItem{key: keys[b.key], lim: lims[b.key], cost: unused, block: b.id})
		case x < 5:
			k := rng.IntN(len(keys))
			cost := float64(1 + rng.IntN(6))
			both(fmt.Sprintf("step %d: a peek of %v on %s", step, cost, keys[k]), bucket.Peek,
				leasedItem{key: keys[k], lim: lims[k], cost: cost})
		default:
			op := bucket.Take
			switch y := rng.IntN(10); {
			case y == 0:
				op = bucket.Refund
			case y < 3:
				op = bucket.Peek
			}
			var its []leasedItem
			for _, k := range rng.Perm(len(keys))[:2+rng.IntN(3)] {
				its = append(its, leasedItem{key: keys[k], lim: lims[k], cost: float64(1 + rng.IntN(4))})
			}
			both(fmt.Sprintf("step %d: %v of %+v", step, op, its), op, its...)
		}
	}
}

// applyLeased applies the call of its to st and answers its decisions.
func applyLeased(ctx context.Context, t *testing.T, st store.Store, op bucket.Op, at time.Time, its ...leasedItem) []drip.Decision {
	t.Helper()
	items := make([]bucket.Prepared, len(its))
	for i, it := range its {
		items[i] = prepareLeased(t, op, it)
	}
	res := make([]bucket.Result, len(items))
	if err := st.Apply(ctx, op, at, items, res); err != nil {
		t.Fatalf("%v %+v: %v", op, its, err)
	}
	ds := make([]drip.Decision, len(res))
	for i := range res {
		ds[i] = drip.DecisionOf(res[i], items[i].Params.Burst)
	}
	return ds
}
