package pgstore_test

import (
	"context"
	"encoding/json"
	"errors"
	neturl "net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/driplimit/drip"
	"github.com/driplimit/drip/bucket"
	"github.com/driplimit/drip/internal/testkit/testserver"
	"github.com/driplimit/drip/replay"
	"github.com/driplimit/drip/store"
	"github.com/driplimit/drip/store/memstore"
	"github.com/driplimit/drip/store/pgstore"
	"github.com/driplimit/drip/storetest"
)

// The conformance suites run in parallel with each other (and with the
// other parallel tests: servers of their own, or keys under a prefix of
// their own on the shared server, at virtual times ahead of the real clock
// that no sweep drops): each spends most of its time waiting for round
// trips to the server, which overlap.
func TestConformance(t *testing.T) {
	t.Parallel()
	st := newStore(t, pgstore.WithoutBatching())
	storetest.Run(t, func(t *testing.T) store.Store { return st })
}

func TestConformanceBatching(t *testing.T) {
	t.Parallel()
	st := newStore(t, pgstore.WithBatching(pgstore.Batching{MaxBatch: 64, InFlight: 4}))
	storetest.Run(t, func(t *testing.T) store.Store { return st })
}

// TestExtremesPast holds the store to the exact model from before 1970
// (storetest.RunExtremesPast), batched and not, on a server of its own:
// the shared one's sweepers (TestPgBouncerConformance's) would delete
// the states, which expired long ago by the server's clock.
func TestExtremesPast(t *testing.T) {
	t.Parallel()
	pg := testserver.StartPostgres(t)
	for _, mode := range []struct{ name, params string }{{"batching", ""}, {"statement", "&drip_batch=off"}} {
		t.Run(mode.name, func(t *testing.T) {
			st, err := pgstore.Open(context.Background(), pg.URL()+"&drip_install=true&drip_sweep=0"+mode.params)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { st.Close() })
			storetest.RunExtremesPast(t, func(t *testing.T) store.Store { return st })
		})
	}
}

// TestSameAsMemstore runs random traces on the memory store and on
// PostgreSQL, and wants every output identical: the SQL math is bucket.Eval
// (and bucket.EvalSliding, on traces of sliding windows) bit for bit
// (storetest allows a tolerance against its exact model; this allows none
// against the Go math).
func TestSameAsMemstore(t *testing.T) {
	for _, mode := range []struct {
		name string
		opts []pgstore.Option
	}{
		{"statement", []pgstore.Option{pgstore.WithoutBatching()}},
		{"batching", []pgstore.Option{pgstore.WithBatching(pgstore.Batching{MaxBatch: 16, InFlight: 2})}},
	} {
		t.Run(mode.name, func(t *testing.T) {
			pg := newStore(t, mode.opts...)
			ctx := context.Background()
			for seed := range uint64(8) {
				// Even seeds: buckets; odd ones: sliding windows.
				gen := storetest.RandomLines
				if seed%2 == 1 {
					gen = storetest.RandomWindowLines
				}
				mem := memstore.New(memstore.WithSweep(0))
				p := prefix()
				epoch := time.Now().Truncate(time.Second)
				for i, l := range gen(seed/2+100, 400) {
					want := do(ctx, mem, epoch, "", l)
					got := do(ctx, pg, epoch, p, l)
					if got != want {
						t.Fatalf("seed %d line %d (%+v):\npostgres %s\nmemory   %s", seed, i, l, got, want)
					}
				}
				mem.Close()
			}
		})
	}
}

func do(ctx context.Context, st store.Store, epoch time.Time, prefix string, l replay.Line) string {
	out, err := replay.Do(ctx, st, epoch, prefix, l)
	if err != nil {
		return "error: " + err.Error()
	}
	b, _ := json.Marshal(out)
	return string(b)
}

// TestHammerOneKey: 64 connections taking from one key at once never get
// more than burst + rate*T, on the server's clock.
func TestHammerOneKey(t *testing.T) {
	for _, mode := range []struct {
		name string
		opts []pgstore.Option
	}{
		{"statement", []pgstore.Option{pgstore.WithoutBatching()}},
		{"batching", []pgstore.Option{pgstore.WithBatching(pgstore.Batching{MaxBatch: 64, InFlight: 4})}},
	} {
		t.Run(mode.name, func(t *testing.T) {
			st := newStore(t, mode.opts...)
			ctx := context.Background()
			key := prefix() + "hot"
			lim := drip.PerSecond(100).WithBurst(50)
			var granted, calls atomic.Int64
			start := time.Now()
			deadline := start.Add(time.Second)
			var wg sync.WaitGroup
			errs := make(chan error, 64)
			for range 64 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					// At least one take each, so that the burst is taken
					// however slowly a loaded machine runs the goroutines.
					for first := true; first || time.Now().Before(deadline); first = false {
						d, err := storetest.Apply(ctx, st, bucket.Take, time.Time{}, drip.Request{Key: key, Limit: lim, Cost: 1})
						if err != nil {
							errs <- err
							return
						}
						calls.Add(1)
						if d.Allowed {
							granted.Add(1)
						}
					}
				}()
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Fatal(err)
			}
			el := time.Since(start)
			bound := 50 + 100*el.Seconds() + 1
			t.Logf("%d decisions, %d granted in %v (bound %.1f)", calls.Load(), granted.Load(), el, bound)
			if g := float64(granted.Load()); g > bound || g < 50 {
				t.Fatalf("granted %v in %v, want between the burst 50 and %.1f", g, el, bound)
			}
		})
	}
}

// TestSerializableRetries runs the store at SERIALIZABLE, where
// PostgreSQL itself raises 40001 under contention as distributed SQL
// databases do: the store retries, grants stay exact, and with retries
// turned off the error surfaces.
func TestSerializableRetries(t *testing.T) {
	pg := pool(t)
	ctx := context.Background()
	url := withParams(pg.Config().ConnString(), "default_transaction_isolation=serializable&pool_max_conns=32")
	open := func(opts ...pgstore.Option) *pgstore.Store {
		s, err := pgstore.Open(ctx, url, append([]pgstore.Option{pgstore.WithSweep(0), pgstore.WithoutBatching()}, opts...)...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		return s
	}
	hammer := func(st *pgstore.Store, key string, lim drip.Limit, at time.Time) (granted int64, err error) {
		var g atomic.Int64
		var wg sync.WaitGroup
		var once sync.Once
		for range 32 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range 10 {
					d, e := storetest.Apply(ctx, st, bucket.Take, at, drip.Request{Key: key, Limit: lim, Cost: 1})
					if e != nil {
						once.Do(func() { err = e })
						return
					}
					if d.Allowed {
						g.Add(1)
					}
				}
			}()
		}
		wg.Wait()
		return g.Load(), err
	}
	lim := drip.PerMinute(1).WithBurst(100)

	st := open(pgstore.WithRetry(1000, 100*time.Microsecond))
	key := prefix() + "ser"
	if _, err := storetest.Apply(ctx, st, bucket.Take, t0, drip.Request{Key: key, Limit: lim, Cost: 0}); err != nil {
		t.Fatal(err)
	}
	g, err := hammer(st, key, lim, t0)
	if err != nil {
		t.Fatalf("with retries: %v", err)
	}
	if g != 100 {
		t.Fatalf("granted %d of 320 at one instant, want exactly the burst 100", g)
	}
	if st.Retries() == 0 {
		t.Fatal("no serialization failure was retried: the test did not exercise the retry path")
	}
	t.Logf("%d retries", st.Retries())

	noRetry := open(pgstore.WithRetry(1, 0))
	key = prefix() + "ser"
	if _, err := storetest.Apply(ctx, noRetry, bucket.Take, t0, drip.Request{Key: key, Limit: lim, Cost: 0}); err != nil {
		t.Fatal(err)
	}
	var surfaced error
	for range 20 {
		if _, err = hammer(noRetry, key, lim, t0); err != nil {
			surfaced = err
			break
		}
	}
	if !pgstore.IsSerializationFailure(surfaced) {
		t.Fatalf("without retries, want a 40001 error to surface, got %v", surfaced)
	}
}

// TestLongKeys: keys over MaxKeyLen (512 bytes) are stored hashed, and
// keys that differ only past it stay apart; keys over store.MaxKeyLen are
// refused.
func TestLongKeys(t *testing.T) {
	st := newStore(t)
	ctx := context.Background()
	lim := drip.PerMinute(1).WithBurst(1)
	p := prefix()
	a := p + strings.Repeat("x", store.MaxKeyLen-64) + "a"
	b := p + strings.Repeat("x", store.MaxKeyLen-64) + "b"
	if _, err := storetest.Apply(ctx, st, bucket.Take, t0, drip.Request{Key: a + strings.Repeat("x", 64), Limit: lim, Cost: 1}); !errors.Is(err, store.ErrKeyTooLong) {
		t.Fatalf("a key over store.MaxKeyLen: %v, want %v", err, store.ErrKeyTooLong)
	}
	for _, k := range []string{a, b, "\xff" + p} {
		d, err := storetest.Apply(ctx, st, bucket.Take, t0, drip.Request{Key: k, Limit: lim, Cost: 1})
		if err != nil || !d.Allowed {
			t.Fatalf("first take on a long key: %+v %v", d, err)
		}
		d, err = storetest.Apply(ctx, st, bucket.Take, t0, drip.Request{Key: k, Limit: lim, Cost: 1})
		if err != nil || d.Allowed {
			t.Fatalf("second take on a long key: %+v %v", d, err)
		}
	}
	if err := st.Reset(ctx, a); err != nil {
		t.Fatal(err)
	}
	if d, err := storetest.Apply(ctx, st, bucket.Take, t0, drip.Request{Key: a, Limit: lim, Cost: 1}); err != nil || !d.Allowed {
		t.Fatalf("after reset: %+v %v", d, err)
	}
}

// TestSweep deletes idle buckets and sliding windows, and only those.
func TestSweep(t *testing.T) {
	db := pool(t)
	st := newStore(t)
	ctx := context.Background()
	p := prefix()
	lim := drip.PerSecond(10)
	now := time.Now()
	// Ten buckets that were full again long ago, and ten that will be
	// for an hour; as many sliding windows whose counts all left long ago
	// and that count for an hour.
	for i := range 10 {
		if _, err := storetest.Apply(ctx, st, bucket.Take, now.Add(-2*time.Hour), drip.Request{Key: p + "wold" + string(rune('a'+i)), Limit: slidingLimit(drip.PerSecond(10), 10), Cost: 1}); err != nil {
			t.Fatal(err)
		}
		if _, err := storetest.Apply(ctx, st, bucket.Take, now, drip.Request{Key: p + "wnew" + string(rune('a'+i)), Limit: slidingLimit(drip.PerHour(1), 6), Cost: 1}); err != nil {
			t.Fatal(err)
		}
		if _, err := storetest.Apply(ctx, st, bucket.Take, now.Add(-2*time.Hour), drip.Request{Key: p + "old" + string(rune('a'+i)), Limit: lim, Cost: 1}); err != nil {
			t.Fatal(err)
		}
		if _, err := storetest.Apply(ctx, st, bucket.Take, now, drip.Request{Key: p + "new" + string(rune('a'+i)), Limit: drip.PerHour(1), Cost: 1}); err != nil {
			t.Fatal(err)
		}
	}
	count := func(pat string) int {
		var n int
		if err := db.QueryRow(ctx, "SELECT count(*) FROM drip.buckets WHERE key LIKE $1::bytea", []byte(p+pat+"%")).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	if count("old") != 10 || count("new") != 10 || count("wold") != 10 || count("wnew") != 10 {
		t.Fatalf("before the sweep: %d old, %d new rows; %d old, %d new sliding windows", count("old"), count("new"), count("wold"), count("wnew"))
	}
	st2, err := pgstore.New(ctx, db, pgstore.WithSweep(0), pgstore.WithSweepPage(7))
	if err != nil {
		t.Fatal(err)
	}
	defer st2.Close()
	if _, err := st2.Sweep(ctx); err != nil {
		t.Fatal(err)
	}
	if count("old") != 0 || count("new") != 10 || count("wold") != 0 || count("wnew") != 10 {
		t.Fatalf("after the sweep: %d old rows (want 0), %d new (want 10); %d old sliding windows (want 0), %d new (want 10)", count("old"), count("new"), count("wold"), count("wnew"))
	}
}

// TestInstall is idempotent, and a store refuses to open without it.
func TestInstall(t *testing.T) {
	db := pool(t)
	ctx := context.Background()
	var wg sync.WaitGroup
	errs := make([]error, 4)
	for i := range errs {
		wg.Add(1)
		go func() { defer wg.Done(); errs[i] = pgstore.Install(ctx, db, pgstore.InstallOptions{}) }()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(ctx, "CREATE SCHEMA IF NOT EXISTS other"); err != nil {
		t.Fatal(err)
	}
}

// TestBatchStatementSameAsMemstore decides runs of consecutive lines of
// random traces in one batch.sql statement each (so requests for the same
// key chain inside the statement) and wants every decision identical to
// the memory store's, made one by one in the same order.
func TestBatchStatementSameAsMemstore(t *testing.T) {
	// chains: runs of up to 24 lines, so keys repeat (batch.sql);
	// distinct: runs end before a key repeats (batch_distinct.sql).
	// The same over traces of sliding windows (with a token bucket in
	// some multi-takes): the statements with slide.sql.
	for _, mode := range []string{"chains", "distinct", "sliding chains", "sliding distinct"} {
		gen := storetest.RandomLines
		if strings.HasPrefix(mode, "sliding") {
			gen = storetest.RandomWindowLines
		}
		t.Run(mode, func(t *testing.T) { testBatchStatement(t, strings.HasSuffix(mode, "distinct"), gen) })
	}
}

func testBatchStatement(t *testing.T, distinct bool, gen func(seed uint64, n int) []replay.Line) {
	pg := newStore(t)
	ctx := context.Background()
	for seed := range uint64(4) {
		mem := memstore.New(memstore.WithSweep(0))
		p := prefix()
		epoch := time.Now().Truncate(time.Second)
		lines := gen(seed+200, 400)
		batches := 0
		for start := 0; start < len(lines); {
			// A run of up to 24 single-request lines (resets and
			// multi-takes end a run and are applied alone).
			end := start
			keys := map[string]bool{}
			for end < len(lines) && end-start < 24 && lines[end].Requests == nil && lines[end].Op != "reset" {
				if distinct && keys[lines[end].Request.Key] {
					break
				}
				keys[lines[end].Request.Key] = true
				end++
			}
			if end == start {
				l := lines[start]
				if got, want := do(ctx, pg, epoch, p, l), do(ctx, mem, epoch, "", l); got != want {
					t.Fatalf("seed %d line %d: postgres %s, memory %s", seed, start, got, want)
				}
				start++
				continue
			}
			var ops []bucket.Op
			var rs, mrs []drip.Request
			var ats []time.Time
			for _, l := range lines[start:end] {
				op, _ := replay.Op(l.Op)
				r := l.Request
				r.Limit = forKey(r.Limit, r.Key)
				mrs = append(mrs, r)
				r.Key = p + r.Key
				ops, rs, ats = append(ops, op), append(rs, r), append(ats, epoch.Add(l.At))
			}
			got, errs := pgstore.ApplyBatch(ctx, pg, ops, rs, ats)
			batches++
			for i := range rs {
				want, werr := storetest.Apply(ctx, mem, ops[i], ats[i], mrs[i])
				if (werr == nil) != (errs[i] == nil) {
					t.Fatalf("seed %d line %d: postgres error %v, memory error %v", seed, start+i, errs[i], werr)
				}
				if werr == nil && got[i] != want {
					t.Fatalf("seed %d line %d (%+v) in a batch of %d:\npostgres %+v\nmemory   %+v", seed, start+i, lines[start+i], end-start, got[i], want)
				}
			}
			start = end
		}
		mem.Close()
		t.Logf("seed %d: %d batches", seed, batches)
	}
}

// TestOpenErrors: a database without the schema is refused with the way
// to install it; unknown drip_ URL parameters are refused; drip_install
// installs.
func TestOpenErrors(t *testing.T) {
	db := pool(t)
	ctx := context.Background()
	name := "empty_" + strings.NewReplacer("-", "_", ":", "_").Replace(strings.TrimSuffix(prefix(), ":"))
	if _, err := db.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		t.Fatal(err)
	}
	u, err := neturl.Parse(db.Config().ConnString())
	if err != nil {
		t.Fatal(err)
	}
	u.Path = "/" + name
	if _, err := pgstore.Open(ctx, u.String()); err == nil || !strings.Contains(err.Error(), "drip pg install") || !strings.Contains(err.Error(), "?drip_install=true") {
		t.Fatalf("open without the schema: %v, want the install hints", err)
	}
	if _, err := pgstore.Open(ctx, "postgres://drip:s3cret@db:badport/app"); err == nil || strings.Contains(err.Error(), "s3cret") {
		t.Fatalf("a bad URL: %v, want an error without the password", err)
	}
	if _, err := pgstore.Open(ctx, withParams(u.String(), "drip_bogus=1")); err == nil || !strings.Contains(err.Error(), "drip_bogus") {
		t.Fatalf("unknown drip_ parameter: %v", err)
	}
	// Misspelt parameters: refused before connecting, naming the
	// nearest known one; a server setting goes through to the server.
	for _, c := range []struct{ params, name, near string }{
		{"drip_bach=1ms", "drip_bach", "drip_batch"},
		{"sslmdoe=verify-full", `"sslmdoe"`, "sslmode"},
		{"sslrootcrt=/ca.pem", `"sslrootcrt"`, "sslrootcert"},
		{"pool_max_con=4", `"pool_max_con"`, "pool_max_conns"},
	} {
		_, err := pgstore.Open(ctx, withParams(u.String(), c.params))
		if err == nil || !strings.Contains(err.Error(), c.name) || !strings.Contains(err.Error(), c.near) {
			t.Errorf("%s: %v, want an error naming %s and %s", c.params, err, c.name, c.near)
		}
	}
	st, err := pgstore.Open(ctx, withParams(u.String(), "drip_install=true&drip_sweep=0&drip_batch=off"))
	if err != nil {
		t.Fatal(err)
	}
	if d, err := storetest.Apply(ctx, st, bucket.Take, t0, drip.Request{Key: "k", Limit: drip.PerSecond(1), Cost: 1}); err != nil || !d.Allowed {
		t.Fatalf("%+v %v", d, err)
	}
	st.Close()
	if _, err := storetest.Apply(ctx, st, bucket.Take, t0, drip.Request{Key: "k", Limit: drip.PerSecond(1), Cost: 1}); err == nil {
		t.Fatal("a decision after Close succeeded")
	}
}

// TestApplyAfterClose checks that a closed store answers at once, with an
// error, instead of queueing calls that nobody decides.
func TestApplyAfterClose(t *testing.T) {
	st := newStore(t)
	st.Close()
	start := time.Now()
	for range 20 {
		if _, err := storetest.Apply(context.Background(), st, bucket.Take, time.Time{}, drip.Request{Key: prefix() + "k", Limit: drip.PerSecond(10), Cost: 1}); err == nil {
			t.Fatal("a take on a closed store succeeded")
		}
	}
	// A call queued after the workers stopped waited a second for an
	// answer: 20 such calls take 20 s, a bound no loaded machine reaches.
	if el := time.Since(start); el > 10*time.Second {
		t.Fatalf("20 takes on a closed store took %v", el)
	}
}

// TestSweepLeases: the rows of a concurrency key whose leases all expired
// long ago (its row in drip.leases and its leases in drip.lease_holders)
// are swept; those of a key with a live lease stay. A reset deletes both.
func TestSweepLeases(t *testing.T) {
	db := pool(t)
	st := newStore(t)
	ctx := context.Background()
	p := prefix()
	lim := drip.InFlight(2, time.Minute)
	now := time.Now()
	for key, at := range map[string]time.Time{"oldslots": now.Add(-2 * time.Hour), "newslots": now, "resetslots": now} {
		for _, lease := range []string{"a", "b"} {
			if _, err := storetest.Apply(ctx, st, bucket.Take, at, drip.Request{Key: p + key, Limit: lim, Lease: lease}); err != nil {
				t.Fatal(err)
			}
		}
	}
	count := func(key string) (keys, leases int) {
		t.Helper()
		if err := db.QueryRow(ctx, "SELECT (SELECT count(*) FROM drip.leases WHERE key = $1::bytea), (SELECT count(*) FROM drip.lease_holders WHERE key = $1::bytea)", []byte(p+key)).Scan(&keys, &leases); err != nil {
			t.Fatal(err)
		}
		return keys, leases
	}
	for _, key := range []string{"oldslots", "newslots", "resetslots"} {
		if k, l := count(key); k != 1 || l != 2 {
			t.Fatalf("before the sweep, %s: %d rows, %d leases, want 1 and 2", key, k, l)
		}
	}
	if _, err := st.Sweep(ctx); err != nil {
		t.Fatal(err)
	}
	if err := st.Reset(ctx, p+"resetslots"); err != nil {
		t.Fatal(err)
	}
	for key, want := range map[string][2]int{"oldslots": {0, 0}, "newslots": {1, 2}, "resetslots": {0, 0}} {
		if k, l := count(key); k != want[0] || l != want[1] {
			t.Errorf("after the sweep and reset, %s: %d rows, %d leases, want %d and %d", key, k, l, want[0], want[1])
		}
	}
	d, err := storetest.Apply(ctx, st, bucket.Peek, now, drip.Request{Key: p + "resetslots", Limit: lim})
	if err != nil || d.Remaining != 2 {
		t.Errorf("after the reset: %+v %v, want 2 free slots", d, err)
	}
}

// forKey is l with a fixed window's grid placed by key, as a store places
// it, so that the prefixed key keeps the grid of the unprefixed one.
func forKey(l drip.Limit, key string) drip.Limit {
	if l.Algorithm == drip.FixedWindow && l.Start == 0 {
		p := l.Period
		if p == 0 {
			p = time.Second
		}
		if l.Start = store.WindowStart(key, p); l.Start == 0 {
			l.Start = p
		}
	}
	return l
}
