package pgstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/driplimit/drip"
	"github.com/driplimit/drip/bucket"
	"github.com/driplimit/drip/internal/testkit/testserver"
	"github.com/driplimit/drip/store"
	"github.com/driplimit/drip/store/pgstore"
	"github.com/driplimit/drip/storetest"
)

// openVia opens a store on url as a user would, with the plain URL (the
// schema installed through it) and the sweeper on a short timer, so that
// sweeps run through the pooler during the test.
func openVia(t *testing.T, url string, params string) *pgstore.Store {
	t.Helper()
	s, err := pgstore.Open(context.Background(), withParams(url, "drip_install=true&drip_sweep=50ms"+params))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// TestPgBouncerConformance runs the conformance suite's parts that hold a
// store's calls to the rules (storetest.RunTransport, its concurrency
// bound included) and the extremes (numbers at their bounds, through the
// pooler's query protocol) through PgBouncer in transaction mode, batched
// and one statement a decision (in parallel, each its own store), with
// the plain URL. The long model comparisons (Traces, Random, Windows,
// Calendar, their replays) send the same statements to the same server
// as TestConformance and TestConformanceBatching do directly, with the
// same parameter and result encodings (the pooler's mode,
// FallbackQueryMode, describes each statement and encodes by the types it
// learns, as the default mode does from its cache); the pooler relays
// them. TestPgBouncerSameAsDirect replays random traces through the
// pooler against a direct connection, answer for answer. Run through
// the pooler, the comparisons took 66 s of the package's time (load
// average 5 to 8), its longest test.
func TestPgBouncerConformance(t *testing.T) {
	t.Parallel()
	bouncer := testserver.StartPgBouncer(t, testserver.SharedPostgres(t), 0)
	for _, mode := range []struct {
		name, params string
	}{
		{"batching", ""},
		{"statement", "&drip_batch=off"},
	} {
		t.Run(mode.name, func(t *testing.T) {
			t.Parallel()
			st := openVia(t, bouncer.URL(), mode.params)
			// LISTEN does not reach the server through the pooler:
			// followers poll, and the suite checks overrides unwatched.
			ns := func(t *testing.T) store.Store { return st }
			storetest.RunTransport(t, ns, storetest.WithoutOverrideNotifications())
			t.Run("Extremes", func(t *testing.T) { storetest.RunExtremes(t, ns) })
			if _, err := st.Sweep(context.Background()); err != nil {
				t.Fatalf("sweep through pgbouncer: %v", err)
			}
		})
	}
}

// TestPgBouncerSameAsDirect replays random traces through PgBouncer and
// on a direct connection, and wants every output identical.
func TestPgBouncerSameAsDirect(t *testing.T) {
	pg := testserver.SharedPostgres(t)
	bouncer := testserver.StartPgBouncer(t, pg, 0)
	direct := openVia(t, pg.URL(), "")
	pooled := openVia(t, bouncer.URL(), "")
	ctx := context.Background()
	for seed := range uint64(3) {
		p1, p2 := prefix(), prefix()
		epoch := time.Now().Truncate(time.Second)
		for i, l := range storetest.RandomLines(seed+300, 400) {
			want := do(ctx, direct, epoch, p1, l)
			got := do(ctx, pooled, epoch, p2, l)
			if got != want {
				t.Fatalf("seed %d line %d (%+v):\npgbouncer %s\ndirect    %s", seed, i, l, got, want)
			}
		}
	}
}

// TestPgBouncerFallsBack makes the pooler's answer to named prepared
// statements happen for sure: one server connection behind it, and two
// client connections that each prepare the same statement there. The
// second one's decision must still be made, exactly once, and the store
// must have switched to the fallback mode.
func TestPgBouncerFallsBack(t *testing.T) {
	bouncer := testserver.StartPgBouncer(t, testserver.SharedPostgres(t), 1)
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(bouncer.URL())
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 2
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	st, err := pgstore.New(ctx, pool, pgstore.WithInstall(pgstore.InstallOptions{}), pgstore.WithSweep(0), pgstore.WithoutBatching())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	if st.QueryMode() != pgstore.DefaultQueryMode {
		t.Fatalf("query mode %v at the start, want %v", st.QueryMode(), pgstore.DefaultQueryMode)
	}
	key := prefix() + "k"
	lim := drip.Limit{Rate: 1, Period: time.Hour, Burst: 3}
	take := func() drip.Decision {
		t.Helper()
		d, err := storetest.Apply(ctx, st, bucket.Take, t0, drip.Request{Key: key, Limit: lim, Cost: 1})
		if err != nil {
			t.Fatalf("take through pgbouncer: %v\n%s", err, bouncer.Log())
		}
		return d
	}
	// Connection A is held while the store prepares on connection B;
	// then B is held and the store must use A, which prepares the same
	// statement on the one server connection: 42P05.
	a, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if d := take(); !d.Allowed || d.Remaining != 2 {
		t.Fatalf("first take: %+v", d)
	}
	b, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	a.Release()
	if d := take(); !d.Allowed || d.Remaining != 1 {
		t.Fatalf("second take (one token taken, exactly): %+v", d)
	}
	b.Release()
	if st.QueryMode() != pgstore.FallbackQueryMode {
		t.Fatalf("query mode %v after the pooler's error, want %v", st.QueryMode(), pgstore.FallbackQueryMode)
	}
	if d := take(); !d.Allowed || d.Remaining != 0 {
		t.Fatalf("third take, after the switch: %+v", d)
	}
	if d := take(); d.Allowed {
		t.Fatalf("a fourth token from a burst of 3: %+v", d)
	}
}

// TestQueryModeFromURL: a mode named in the URL is the store's, with no
// switch.
func TestQueryModeFromURL(t *testing.T) {
	st := openVia(t, testserver.SharedPostgres(t).URL(), "&default_query_exec_mode=simple_protocol")
	if st.QueryMode() != pgx.QueryExecModeSimpleProtocol {
		t.Fatalf("query mode %v, want simple_protocol", st.QueryMode())
	}
	d, err := storetest.Apply(context.Background(), st, bucket.Take, t0, drip.Request{Key: prefix() + "k", Limit: drip.PerSecond(1), Cost: 1})
	if err != nil || !d.Allowed {
		t.Fatalf("take: %+v %v", d, err)
	}
}
