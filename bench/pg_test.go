package bench

// drip's PostgreSQL store beside two common ways of keeping a token bucket
// in PostgreSQL, on one server in one run, so that the ratios in BENCHMARKS.md compare like with
// like:
//
//	cd bench && go test -run '^$' -bench 'Postgres' -benchtime 4000x
//
// The server is started by the harness (internal/testserver) with
// production durability: fsync on, synchronous commits. Implementations:
//
//   - for-update: a SELECT ... FOR UPDATE transaction, five round trips a
//     decision: BEGIN; INSERT ... ON CONFLICT DO NOTHING; SELECT ... FOR
//     UPDATE; compute in Go; upsert; COMMIT.
//   - plpgsql: a PL/pgSQL function that updates the row, then inserts it
//     when it was missing, at SERIALIZABLE, with the retries on 40001 it
//     needs under contention.
//   - drip: pgstore with batching off, one statement a decision, on a
//     logged table; drip-unlogged the same on an UNLOGGED table;
//     drip-batch and drip-batch-unlogged with batching on, the default.
//
// Workloads: 1, 16 and 64 concurrent callers, on 100,000 keys (uniform, all
// rows present) or on one hot key, under a limit that always allows, so
// that every decision writes. Metrics: decisions/s, p50 and p99 latency
// (µs) of one decision as its caller sees it.

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/driplimit/drip"
	"github.com/driplimit/drip/internal/testkit/testserver"
	"github.com/driplimit/drip/store/pgstore"
)

// pgRate is the limit of every implementation: a million per second, burst
// a million: every decision is allowed and writes.
const pgRate = 1_000_000

var pgServer struct {
	once sync.Once
	url  string
	srv  *testserver.Postgres // nil with DRIP_BENCH_POSTGRES_URL
	err  error
}

// pgURL starts the benchmark server once per binary, or uses
// DRIP_BENCH_POSTGRES_URL.
func pgURL(b *testing.B) string {
	b.Helper()
	if u := os.Getenv("DRIP_BENCH_POSTGRES_URL"); u != "" {
		return u
	}
	pgServer.once.Do(func() {
		srv, err := testserver.NewPostgres("fsync=on", "full_page_writes=on", "synchronous_commit=on", "max_connections=300")
		if err != nil {
			pgServer.err = err
			return
		}
		pgServer.url, pgServer.srv = srv.URL(), srv
		pgStop = func() { srv.Stop(); srv.Remove() }
	})
	if pgServer.err != nil {
		b.Skipf("no PostgreSQL: %v", pgServer.err)
	}
	return pgServer.url
}

var pgStop = func() {}

func TestMain(m *testing.M) {
	code := m.Run()
	pgStop()
	os.Exit(code)
}

type pgImpl struct {
	name     string
	unlogged bool
	open     func(b *testing.B, url string, conns int) decider
}

// pgCommit is appended to every pool's URL: "" (synchronous commits, the
// server's default) or "&synchronous_commit=off".
var pgCommit = ""

func pgPool(b *testing.B, url string, conns int, params string) *pgxpool.Pool {
	b.Helper()
	sep := "?"
	if strings.Contains(url, "?") {
		sep = "&"
	}
	p, err := pgxpool.New(context.Background(), fmt.Sprintf("%s%spool_max_conns=%d%s%s", url, sep, conns, params, pgCommit))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(p.Close)
	return p
}

func pgExec(b *testing.B, db *pgxpool.Pool, sql string, args ...any) {
	b.Helper()
	if _, err := db.Exec(context.Background(), sql, args...); err != nil {
		b.Fatalf("%s: %v", sql, err)
	}
}

// pgForUpdate is the transaction of five round trips: make sure the row
// exists, lock it, compute in Go (an interval refill, the application's
// clock, float tokens), write it back if allowed, commit.
func pgForUpdate(b *testing.B, url string, conns int) decider {
	db := pgPool(b, url, conns, "")
	pgExec(b, db, `CREATE TABLE IF NOT EXISTS bench_for_update (
		key text PRIMARY KEY, tokens double precision NOT NULL,
		refilled_at timestamptz NOT NULL, expires_at timestamptz NOT NULL)`)
	pgExec(b, db, `INSERT INTO bench_for_update
		SELECT 'user:' || i, $1, now(), now() + interval '1 hour' FROM generate_series(0, $2 - 1) i
		ON CONFLICT DO NOTHING`, pgRate, keyCount)
	const burst, perPeriod, period = float64(pgRate), float64(pgRate), time.Second
	return func(ctx context.Context, key string) (bool, error) {
		now := time.Now()
		tx, err := db.Begin(ctx)
		if err != nil {
			return false, err
		}
		defer tx.Rollback(ctx)
		if _, err := tx.Exec(ctx, `INSERT INTO bench_for_update VALUES ($1, $2, $3, $4)
			ON CONFLICT (key) DO NOTHING`, key, burst, now, now.Add(period)); err != nil {
			return false, err
		}
		var tokens float64
		var refilledAt, expiresAt time.Time
		if err := tx.QueryRow(ctx, `SELECT tokens, refilled_at, expires_at FROM bench_for_update
			WHERE key = $1 FOR UPDATE`, key).Scan(&tokens, &refilledAt, &expiresAt); err != nil {
			return false, err
		}
		periods := float64(int64(now.Sub(refilledAt) / period))
		left := min(tokens+periods*perPeriod, burst) - 1
		if left < 0 {
			return false, tx.Commit(ctx)
		}
		if _, err := tx.Exec(ctx, `INSERT INTO bench_for_update VALUES ($1, $2, $3, $4)
			ON CONFLICT (key) DO UPDATE SET tokens = $2, refilled_at = $3, expires_at = $4`,
			key, left, now, now.Add(period)); err != nil {
			return false, err
		}
		return true, tx.Commit(ctx)
	}
}

// pgPLpgSQL is a PL/pgSQL function of one UPDATE (take a token, add the
// refill since ts as a fraction of integer tokens, clamp, move ts to now)
// and, when the row is missing, one INSERT of a full bucket less one. It
// runs at SERIALIZABLE, so callers retry serialization failures (and the
// unique violation of two first calls racing to insert).
func pgPLpgSQL(b *testing.B, url string, conns int) decider {
	db := pgPool(b, url, conns, "&default_transaction_isolation=serializable")
	pgExec(b, db, `CREATE TABLE IF NOT EXISTS bench_plpgsql (
		key text PRIMARY KEY, tokens bigint NOT NULL, ts timestamptz NOT NULL)`)
	pgExec(b, db, `CREATE OR REPLACE FUNCTION bench_plpgsql_take(k text, per_sec int, burst_secs int)
RETURNS int LANGUAGE plpgsql AS $fn$
DECLARE
	left_after int;
BEGIN
	UPDATE bench_plpgsql
	SET ts = now(),
	    tokens = greatest(least(tokens - 1 + per_sec * extract(epoch FROM clock_timestamp() - ts),
	                            burst_secs * per_sec), -1)
	WHERE key = k
	RETURNING tokens INTO left_after;
	IF left_after IS NULL THEN
		INSERT INTO bench_plpgsql VALUES (k, burst_secs * per_sec - 1, clock_timestamp())
		RETURNING tokens INTO left_after;
	END IF;
	RETURN left_after; -- -1: denied
END
$fn$`)
	pgExec(b, db, `INSERT INTO bench_plpgsql
		SELECT 'user:' || i, $1, clock_timestamp() FROM generate_series(0, $2 - 1) i
		ON CONFLICT DO NOTHING`, pgRate, keyCount)
	return func(ctx context.Context, key string) (bool, error) {
		for {
			var left int64
			err := db.QueryRow(ctx, "SELECT bench_plpgsql_take($1, $2, 1)", key, pgRate).Scan(&left)
			var pe *pgconn.PgError
			if errors.As(err, &pe) && (pe.Code == "40001" || pe.Code == "40P01" || pe.Code == "23505") {
				continue
			}
			return err == nil && left >= 0, err
		}
	}
}

// pgDrip is pgstore through the Limiter users call.
func pgDrip(unlogged bool, opts ...pgstore.Option) func(b *testing.B, url string, conns int) decider {
	return func(b *testing.B, url string, conns int) decider {
		db := pgPool(b, url, conns, "")
		ctx := context.Background()
		if err := pgstore.Install(ctx, db, pgstore.InstallOptions{Unlogged: unlogged, Logged: !unlogged}); err != nil {
			b.Fatal(err)
		}
		// All keys present and full, as for the other implementations.
		pgExec(b, db, `INSERT INTO drip.buckets
			SELECT convert_to('user:' || i, 'UTF8'), $1::bigint * 1000000, drip.clock(), drip.clock() + 3600000000000
			FROM generate_series(0, $2 - 1) i ON CONFLICT DO NOTHING`, pgRate, keyCount)
		pgExec(b, db, "CHECKPOINT")
		st, err := pgstore.New(ctx, db, append([]pgstore.Option{pgstore.WithSweep(0)}, opts...)...)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { st.Close() })
		l := drip.New(st, drip.PerSecond(pgRate))
		return func(ctx context.Context, key string) (bool, error) {
			d, err := l.Take(ctx, key)
			return d.Allowed, err
		}
	}
}

var pgImpls = []pgImpl{
	{"for-update", false, pgForUpdate},
	{"plpgsql", false, pgPLpgSQL},
	{"drip", false, pgDrip(false, pgstore.WithoutBatching())},
	{"drip-batch", false, pgDrip(false)}, // the default
	{"drip-unlogged", true, pgDrip(true, pgstore.WithoutBatching())},
	{"drip-batch-unlogged", true, pgDrip(true)},
}

// BenchmarkPostgres measures with synchronous commits (each decision is
// on disk before it is answered); BenchmarkPostgresAsyncCommit with
// synchronous_commit=off on every implementation's connections (a crash
// may lose the last fraction of a second of decisions, as a rate limiter
// can usually afford).
func BenchmarkPostgres(b *testing.B) {
	pgCommit = ""
	pgBench(b)
}

func BenchmarkPostgresAsyncCommit(b *testing.B) {
	pgCommit = "&synchronous_commit=off"
	pgBench(b)
}

// pgBench runs every implementation on every workload: the logged ones
// first, then the unlogged ones, so that drip's table is converted (a
// rewrite) once, before a checkpoint, and never between measurements.
func pgBench(b *testing.B) {
	url := pgURL(b)
	for _, unlogged := range []bool{false, true} {
		for _, workload := range []string{"100k-keys", "hot-key"} {
			for _, callers := range []int{1, 16, 64} {
				for _, impl := range pgImpls {
					if impl.unlogged != unlogged {
						continue
					}
					b.Run(fmt.Sprintf("%s/callers=%d/%s", workload, callers, impl.name), func(b *testing.B) {
						decide := impl.open(b, url, callers)
						pgRun(b, callers, workload == "hot-key", decide)
					})
				}
			}
		}
	}
}

// pgRun makes b.N decisions from callers goroutines and reports
// throughput and latency percentiles.
func pgRun(b *testing.B, callers int, hot bool, decide decider) {
	r := closedLoop(b, callers, hot, 7, decide)
	b.ReportMetric(float64(b.N)/r.elapsed.Seconds(), "decisions/s")
	b.ReportMetric(pct(r.lat, 0.5), "p50-µs")
	b.ReportMetric(pct(r.lat, 0.99), "p99-µs")
}

// BenchmarkPostgresBatchTuning measures batching's knobs at 16 and 64
// callers on the logged table with synchronous commits: how many batch
// statements in flight, and the gathering window.
func BenchmarkPostgresBatchTuning(b *testing.B) {
	url := pgURL(b)
	pgCommit = ""
	for _, workload := range []string{"100k-keys", "hot-key"} {
		for _, callers := range []int{16, 64} {
			for _, conns := range []int{1, 2, 4} {
				for _, window := range []time.Duration{0, 200 * time.Microsecond} {
					name := fmt.Sprintf("%s/callers=%d/conns=%d/window=%v", workload, callers, conns, window)
					b.Run(name, func(b *testing.B) {
						decide := pgDrip(false, pgstore.WithBatching(pgstore.Batching{Window: window, InFlight: conns}))(b, url, callers)
						pgRun(b, callers, workload == "hot-key", decide)
					})
				}
			}
		}
	}
}

// pgModes are pgx's query modes (default_query_exec_mode), the first its
// default. Only the first needs named prepared statements on the server
// connection, which a transaction-mode pooler (PgBouncer before 1.21, or
// without max_prepared_statements) does not keep.
var pgModes = []string{"cache_statement", "cache_describe", "describe_exec", "exec", "simple_protocol"}

var pgModeOf = map[string]pgx.QueryExecMode{
	"cache_statement": pgx.QueryExecModeCacheStatement,
	"cache_describe":  pgx.QueryExecModeCacheDescribe,
	"describe_exec":   pgx.QueryExecModeDescribeExec,
	"exec":            pgx.QueryExecModeExec,
	"simple_protocol": pgx.QueryExecModeSimpleProtocol,
}

// BenchmarkPostgresQueryMode measures what each of pgx's query modes costs
// drip on a direct connection (logged table, synchronous commits), one
// decision a statement (batching off) and batched (the default), at 1 and
// 16 callers on 100,000 keys:
//
//	cd bench && go test -run '^$' -bench 'PostgresQueryMode' -benchtime 4000x -count 3
func BenchmarkPostgresQueryMode(b *testing.B) {
	url := pgURL(b)
	pgCommit = ""
	for _, callers := range []int{1, 16} {
		for _, batch := range []bool{false, true} {
			for _, mode := range pgModes {
				name := fmt.Sprintf("callers=%d/batch=%v/mode=%s", callers, batch, mode)
				b.Run(name, func(b *testing.B) {
					opts := []pgstore.Option{pgstore.WithQueryMode(pgModeOf[mode])}
					if !batch {
						opts = append(opts, pgstore.WithoutBatching())
					}
					decide := pgDrip(false, opts...)(b, url, callers)
					pgRun(b, callers, false, decide)
				})
			}
		}
	}
}
