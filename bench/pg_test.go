package bench

// drip's PostgreSQL store beside the two patterns of the seeds, on one
// server in one run, so that the ratios in BENCHMARKS.md compare like with
// like:
//
//	cd bench && go test -run '^$' -bench 'Postgres' -benchtime 4000x
//
// The server is started by the harness (internal/testserver) with
// production durability: fsync on, synchronous commits. Implementations:
//
//   - seed-a: seed 000's pattern, five round trips a decision: BEGIN;
//     INSERT ... ON CONFLICT DO NOTHING; SELECT ... FOR UPDATE; compute in
//     Go; upsert; COMMIT.
//   - seed-b: seed 002's PL/pgSQL function, verbatim, at SERIALIZABLE, with
//     the retries on 40001 it needs under contention.
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

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/driplimit/drip"
	"github.com/driplimit/drip/internal/testserver"
	"github.com/driplimit/drip/store/pgstore"
)

// pgRate is the limit of every implementation: a million per second, burst
// a million: every decision is allowed and writes.
const pgRate = 1_000_000

var pgServer struct {
	once sync.Once
	url  string
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
		pgServer.url = srv.URL()
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

// pgSeedA is seed 000's transaction, as written there (interval refill,
// the app's clock, tokens as a number).
func pgSeedA(b *testing.B, url string, conns int) decider {
	db := pgPool(b, url, conns, "")
	pgExec(b, db, `CREATE TABLE IF NOT EXISTS rate_limit_ephemeral (
		prefix text NOT NULL, key text NOT NULL, tokens double precision NOT NULL,
		last_refill timestamptz NOT NULL, expires_at timestamptz NOT NULL,
		PRIMARY KEY (prefix, key))`)
	pgExec(b, db, `INSERT INTO rate_limit_ephemeral
		SELECT 'api', 'user:' || i, $1, now(), now() + interval '1 hour' FROM generate_series(0, $2 - 1) i
		ON CONFLICT DO NOTHING`, pgRate, keyCount)
	const maxTokens, refill, interval = float64(pgRate), float64(pgRate), time.Second
	ttl := interval
	return func(ctx context.Context, key string) (bool, error) {
		now := time.Now()
		tx, err := db.Begin(ctx)
		if err != nil {
			return false, err
		}
		defer tx.Rollback(ctx)
		if _, err := tx.Exec(ctx, `INSERT INTO rate_limit_ephemeral (prefix, key, tokens, last_refill, expires_at)
			VALUES ($1, $2, $3, $4, $5) ON CONFLICT (prefix, key) DO NOTHING`, "api", key, maxTokens, now, now.Add(ttl)); err != nil {
			return false, err
		}
		var tokens float64
		var last, exp time.Time
		if err := tx.QueryRow(ctx, `SELECT tokens, last_refill, expires_at FROM rate_limit_ephemeral
			WHERE prefix = $1 AND key = $2 FOR UPDATE`, "api", key).Scan(&tokens, &last, &exp); err != nil {
			return false, err
		}
		elapsed := now.Sub(last)
		refilled := float64(int64(elapsed/interval)) * refill
		current := min(tokens+refilled, maxTokens)
		next := current - 1
		ok := next >= 0
		if ok {
			if _, err := tx.Exec(ctx, `INSERT INTO rate_limit_ephemeral (prefix, key, tokens, last_refill, expires_at)
				VALUES ($1, $2, $3, $4, $5) ON CONFLICT (prefix, key) DO UPDATE
				SET tokens = $3, last_refill = $4, expires_at = $5`, "api", key, next, now, now.Add(ttl)); err != nil {
				return false, err
			}
		}
		return ok, tx.Commit(ctx)
	}
}

// pgSeedB is seed 002's function, verbatim, at SERIALIZABLE, retried on
// serialization failures as the seed says an application must.
func pgSeedB(b *testing.B, url string, conns int) decider {
	db := pgPool(b, url, conns, "&default_transaction_isolation=serializable")
	pgExec(b, db, `CREATE TABLE IF NOT EXISTS rate_limiting_token_bucket (
		id text primary key, tk bigint not null, ts timestamptz not null)`)
	pgExec(b, db, `create or replace function rate_limiting_token_bucket_request
 (rate_id text, refill_per_sec int default 2
 , window_seconds int default 60)
 returns int as $$
declare
 new_tk int:=null; -- stores the remaining token to return
begin
    -- take 1 token and add refilled ones
    -- (returns the remaining tokens, or NULL if id is not found)
    update rate_limiting_token_bucket
     set ts=now(), tk=greatest(least(
      tk-1+refill_per_sec*extract(epoch from clock_timestamp()-ts)
      ,window_seconds*refill_per_sec),-1)
     where rate_limiting_token_bucket.id=rate_id
     returning tk into new_tk;
    -- fill initial window if first call if id was not found
    if new_tk is null then
     insert into rate_limiting_token_bucket (id, tk,ts)
      values (rate_id,window_seconds*refill_per_sec-1,clock_timestamp())
      returning tk into new_tk;
    end if;
    -- return the remaining tokens
    return new_tk;
end; $$ language plpgsql`)
	pgExec(b, db, `INSERT INTO rate_limiting_token_bucket
		SELECT 'user:' || i, $1, clock_timestamp() FROM generate_series(0, $2 - 1) i
		ON CONFLICT DO NOTHING`, pgRate, keyCount)
	return func(ctx context.Context, key string) (bool, error) {
		for {
			var tk int64
			err := db.QueryRow(ctx, "SELECT rate_limiting_token_bucket_request($1, $2, 1)", key, pgRate).Scan(&tk)
			var pe *pgconn.PgError
			if errors.As(err, &pe) && (pe.Code == "40001" || pe.Code == "40P01" || pe.Code == "23505") {
				continue
			}
			return err == nil && tk >= 0, err
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
		// All keys present and full, as for the seeds.
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
	{"seed-a", false, pgSeedA},
	{"seed-b", false, pgSeedB},
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
