package pgstore

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"maps"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/driplimit/drip/internal/nearest"
	"github.com/driplimit/drip/internal/redact"
)

//go:embed sql/*.sql
var sqlFiles embed.FS

func mustSQL(name string) string {
	b, err := sqlFiles.ReadFile("sql/" + name)
	if err != nil {
		panic(err)
	}
	return string(b)
}

// withEval is a statement with the math of eval.sql in place of {{EVAL}}:
// for requests that are no sliding window.
func withEval(name string) string {
	return strings.ReplaceAll(mustSQL(name), "{{EVAL}}", "\n"+mustSQL("eval.sql"))
}

// withSliding is a statement with sliding.sql in place of {{EVAL}}: eval.sql
// or, for a sliding window, slide.sql. The store sends it only when a
// request is a sliding window, so the others keep the plain statement.
func withSliding(name string) string {
	both := strings.NewReplacer("{{BUCKET}}", "\n"+mustSQL("eval.sql"), "{{SLIDE}}", "\n"+mustSQL("slide.sql")).Replace(mustSQL("sliding.sql"))
	return strings.ReplaceAll(mustSQL(name), "{{EVAL}}", "\n"+both)
}

// goColumns are the columns take.sql and peek.sql return to the Go store
// only: the stored state before the decision (a sliding window's).
const goColumns = ", coalesce(d.b_ts, 0), d.b_counts, d.blocked"

var (
	// takeSQL is take.sql with its caller's deadline ($12), for the Go
	// store (takeSlidingSQL when the request is a sliding window);
	// takeFuncSQL without one, for the SQL function drip.apply_one.
	goTake          = strings.NewReplacer("{{LATE}}", "coalesce(drip.clock() >= $12::bigint, false)", "{{GO_COLUMNS}}", ", d.late"+goColumns+", d.cap", "{{BLOCKS}}", "true")
	takeSQL         = goTake.Replace(withEval("take.sql"))
	takeSlidingSQL  = goTake.Replace(withSliding("take.sql"))
	takeFuncSQL     = strings.NewReplacer("{{LATE}}", "false", "{{GO_COLUMNS}}", "", "{{BLOCKS}}", "false").Replace(withEval("take.sql"))
	goPeek          = strings.NewReplacer("{{GO_COLUMNS}}", ", coalesce(i.b_ts, 0), i.counts, i.blocked, i.cap", "{{BLOCKS}}", "true")
	peekSQL         = goPeek.Replace(withEval("peek.sql"))
	peekSlidingSQL  = goPeek.Replace(withSliding("peek.sql"))
	peekFuncSQL     = strings.NewReplacer("{{GO_COLUMNS}}", "", "{{BLOCKS}}", "false").Replace(withEval("peek.sql"))
	multiSQL        = withEval("multi.sql")
	multiSlidingSQL = withSliding("multi.sql")
	batchSQL        = withEval("batch.sql")
	batchSlidingSQL = withSliding("batch.sql")
	// batchDistinctSQL is batch.sql for distinct keys: no recursion.
	batchDistinctSQL        = withEval("batch_distinct.sql")
	batchDistinctSlidingSQL = withSliding("batch_distinct.sql")
	sweepSQL                = mustSQL("sweep.sql")
	resetSQL                = "WITH b AS (DELETE FROM drip.buckets WHERE key = $1::bytea) SELECT drip.lease_drop($1::bytea)"
	sweepLeasesSQL          = mustSQL("sweep_leases.sql")
	blocksSQL               = withEval("blocks.sql")
	migration               = []string{mustSQL("001_schema.sql"), mustSQL("002_leases.sql"), mustSQL("003_overrides.sql"), mustSQL("004_override_changes.sql"), mustSQL("005_lease_rows.sql"),
		mustSQL("006_sliding.sql"), mustSQL("007_blocks.sql"), mustSQL("008_blocks_in_buckets.sql"),
		mustSQL("009_board.sql")}
)

// SchemaVersion is the version of the drip schema this package installs
// and expects. Install migrates older schemas to it.
var SchemaVersion = len(migration)

// InstallOptions tunes Install.
type InstallOptions struct {
	// Unlogged makes the bucket and lease tables UNLOGGED: faster (no
	// WAL), but emptied by crash recovery, which can admit up to one extra
	// burst per key (and free every in-flight slot) after a crash. Existing
	// tables are converted (ALTER TABLE ... SET UNLOGGED rewrites them under
	// an exclusive lock). The overrides table is always logged.
	Unlogged bool
	// Logged converts existing UNLOGGED tables back to logged ones.
	Logged bool
}

// installLock is the advisory lock that serializes concurrent installs.
const installLock = 0x64726970 // "drip"

// Install creates the drip schema, or migrates it to SchemaVersion, and
// (re)creates its functions, in one transaction. It is idempotent and safe
// to run from several processes at once: the transaction takes a
// transaction-level advisory lock (released by its commit or rollback, so
// it holds through a pooler in transaction mode, where a session-level
// lock would be left on a server connection other clients then get).
// Its statements prepare nothing by name (FallbackQueryMode), so it runs
// through such a pooler as it is.
func Install(ctx context.Context, db DB, o InstallOptions) error {
	if o.Logged && o.Unlogged {
		return errors.New("pgstore: install: Logged and Unlogged both set")
	}
	if m, ok := db.(modeDB); ok {
		db = m.db
	}
	db = newModeDB(db, FallbackQueryMode)
	err := pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1)", installLock); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `CREATE SCHEMA IF NOT EXISTS drip;
CREATE TABLE IF NOT EXISTS drip.schema_version (version int NOT NULL)`); err != nil {
			return err
		}
		var v int
		if err := tx.QueryRow(ctx, "SELECT coalesce(max(version), 0) FROM drip.schema_version").Scan(&v); err != nil {
			return err
		}
		if v > SchemaVersion {
			return fmt.Errorf("drip schema version %d is newer than this drip (%d): upgrade drip", v, SchemaVersion)
		}
		for i := v; i < SchemaVersion; i++ {
			sql := migration[i]
			persistence := ""
			if o.Unlogged {
				persistence = "UNLOGGED"
			}
			sql = strings.ReplaceAll(sql, "{{PERSISTENCE}}", persistence)
			if _, err := tx.Exec(ctx, sql); err != nil {
				return fmt.Errorf("migration %d: %w", i+1, err)
			}
		}
		if _, err := tx.Exec(ctx, "DELETE FROM drip.schema_version; INSERT INTO drip.schema_version VALUES ("+strconv.Itoa(SchemaVersion)+")"); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, mustSQL("functions.sql")); err != nil {
			return fmt.Errorf("functions.sql: %w", err)
		}
		if _, err := tx.Exec(ctx, mustSQL("leases.sql")); err != nil {
			return fmt.Errorf("leases.sql: %w", err)
		}
		if _, err := tx.Exec(ctx, blocksSQL); err != nil {
			return fmt.Errorf("blocks.sql: %w", err)
		}
		// take.sql and peek.sql as SQL functions, so that drip.take runs
		// the very statements the Go store runs.
		sig := "(bytea, int, int, bigint, bigint, bigint, bigint, bigint, bigint, bool, bigint) RETURNS TABLE (allowed bool, n_tokens bigint, n_ts bigint, now bigint, ok bool) LANGUAGE sql VOLATILE AS $drip$\n"
		for name, body := range map[string]string{"apply_one": takeFuncSQL, "peek_one": peekFuncSQL} {
			if _, err := tx.Exec(ctx, "CREATE OR REPLACE FUNCTION drip."+name+sig+body+"\n$drip$"); err != nil {
				return fmt.Errorf("drip.%s: %w", name, err)
			}
		}
		if _, err := tx.Exec(ctx, mustSQL("api.sql")); err != nil {
			return fmt.Errorf("api.sql: %w", err)
		}
		if o.Unlogged || o.Logged {
			var persistence string
			if err := tx.QueryRow(ctx, "SELECT relpersistence::text FROM pg_class WHERE oid = 'drip.buckets'::regclass").Scan(&persistence); err != nil {
				return err
			}
			if o.Unlogged && persistence != "u" {
				_, err := tx.Exec(ctx, "ALTER TABLE drip.buckets SET UNLOGGED; ALTER TABLE drip.leases SET UNLOGGED; ALTER TABLE drip.lease_holders SET UNLOGGED")
				return err
			}
			if o.Logged && persistence == "u" {
				_, err := tx.Exec(ctx, "ALTER TABLE drip.buckets SET LOGGED; ALTER TABLE drip.leases SET LOGGED; ALTER TABLE drip.lease_holders SET LOGGED")
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("pgstore: install: %w", err)
	}
	return nil
}

// checkVersion fails with a hint when the schema is missing or not the one
// this package expects.
func checkVersion(ctx context.Context, db DB) error {
	var v int
	err := db.QueryRow(ctx, "SELECT coalesce(max(version), 0) FROM drip.schema_version").Scan(&v)
	var pe *pgconn.PgError
	if errors.As(err, &pe) && (pe.Code == "42P01" || pe.Code == "3F000") {
		return errors.New("pgstore: the drip schema is not installed: run `drip pg install --url ...`, or add ?drip_install=true to the store URL (drip serve and drip replay), or open the store with pgstore.WithInstall")
	}
	if err != nil {
		return fmt.Errorf("pgstore: %w", err)
	}
	if v != SchemaVersion {
		return fmt.Errorf("pgstore: drip schema version %d, want %d: run `drip pg install --url ...` to migrate", v, SchemaVersion)
	}
	return nil
}

// dripParams are drip's own URL parameters (Open).
var dripParams = []string{"drip_install", "drip_unlogged", "drip_sweep", "drip_batch", "drip_batch_max", "drip_batch_conns"}

// pgxParams are the URL parameters pgx reads itself (pgconn's, pgx's and
// pgxpool's); it sends every other to the server as a setting
// (application_name, search_path, statement_timeout ...).
var pgxParams = []string{
	"host", "port", "database", "dbname", "user", "password", "passfile", "connect_timeout",
	"sslmode", "sslkey", "sslcert", "sslcertmode", "sslrootcert", "sslnegotiation", "sslpassword", "sslsni",
	"krbspn", "krbsrvname", "target_session_attrs", "service", "servicefile",
	"min_protocol_version", "max_protocol_version", "channel_binding", "require_auth",
	"statement_cache_capacity", "description_cache_capacity", "default_query_exec_mode",
	"pool_max_conns", "pool_min_conns", "pool_min_idle_conns", "pool_max_conn_lifetime",
	"pool_max_conn_idle_time", "pool_health_check_period", "pool_max_conn_lifetime_jitter", "pool_ping_timeout",
}

// misspeltParam refuses a parameter that is not pgx's but one or two
// letters from one of them (sslmdoe, sslrootcrt): pgx would send it to
// the server as a setting, and the connection would go without the one
// meant (sslmode=verify-full, a CA). Other parameters are the server's
// settings, and the server judges them.
func misspeltParam(q url.Values) error {
	for _, k := range slices.Sorted(maps.Keys(q)) {
		if len(k) < 4 || slices.Contains(pgxParams, k) {
			continue
		}
		if near, d := nearest.Name(k, pgxParams); d <= 2 {
			return fmt.Errorf("pgstore: unknown URL parameter %q: did you mean %s? (a parameter pgx does not know goes to the server as a setting)", k, near)
		}
	}
	return nil
}

// NewPool connects a pgx pool to rawURL (pgx's parameters only), for
// Install. Its default query mode is FallbackQueryMode unless the URL
// names one (default_query_exec_mode), so that statements run on it work
// through a pooler in transaction mode too. (The store sends its own
// statements with a mode of its own: see DefaultQueryMode.)
func NewPool(ctx context.Context, rawURL string) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(rawURL)
	if err != nil {
		return nil, fmt.Errorf("pgstore: %w", err)
	}
	if u, err := url.Parse(rawURL); err == nil && !u.Query().Has("default_query_exec_mode") {
		cfg.ConnConfig.DefaultQueryExecMode = FallbackQueryMode
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("pgstore: %w", err)
	}
	return pool, nil
}

// Open connects to the PostgreSQL server at rawURL with a pool of its own
// (closed by Close) and returns a store on it. Besides pgx's own
// parameters (pool_max_conns, ...), the URL may carry drip's, which are
// removed before connecting:
//
//	drip_install=true       install or migrate the schema first (WithInstall)
//	drip_unlogged=true      with drip_install: an UNLOGGED table
//	drip_sweep=1m           sweeper interval, 0 to turn it off (WithSweep)
//	drip_batch=200us        batching window (WithBatching), or off
//	drip_batch_max=128      largest batch (1: batching off)
//	drip_batch_conns=2      batches in flight at once
//
// Another drip_ parameter, or one a letter or two from pgx's own
// (sslmdoe=), is an error that names the nearest known one; pgx sends
// the rest to the server as settings. Options given in opts apply after
// the URL's.
func Open(ctx context.Context, rawURL string, opts ...Option) (*Store, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return nil, redact.Error(fmt.Errorf("pgstore: bad URL: %w", err))
	}
	q := u.Query()
	var urlOpts []Option
	var inst InstallOptions
	install := false
	batching, batch := DefaultBatching, false
	for k, vs := range q {
		if !strings.HasPrefix(k, "drip_") {
			continue
		}
		v := vs[len(vs)-1]
		q.Del(k)
		var perr error
		switch k {
		case "drip_install":
			install, perr = strconv.ParseBool(v)
		case "drip_unlogged":
			inst.Unlogged, perr = strconv.ParseBool(v)
		case "drip_sweep":
			var d time.Duration
			d, perr = time.ParseDuration(v)
			urlOpts = append(urlOpts, WithSweep(d))
		case "drip_batch":
			batch = true
			if v == "off" {
				batching.MaxBatch = 1
			} else {
				batching.Window, perr = time.ParseDuration(v)
			}
		case "drip_batch_max":
			batch = true
			batching.MaxBatch, perr = strconv.Atoi(v)
			batching.MaxBatch = max(1, batching.MaxBatch) // 0: off, not the default
		case "drip_batch_conns":
			batch = true
			batching.InFlight, perr = strconv.Atoi(v)
		default:
			near, _ := nearest.Name(k, dripParams)
			perr = fmt.Errorf("unknown parameter (the nearest of drip's is %s)", near)
		}
		if perr != nil {
			return nil, fmt.Errorf("pgstore: URL parameter %s=%q: %v", k, v, perr)
		}
	}
	if err := misspeltParam(q); err != nil {
		return nil, err
	}
	if install {
		urlOpts = append(urlOpts, WithInstall(inst))
	}
	if batch {
		urlOpts = append(urlOpts, WithBatching(batching))
	}
	u.RawQuery = q.Encode()
	cfg, err := pgxpool.ParseConfig(u.String())
	if err != nil {
		return nil, fmt.Errorf("pgstore: %w", err)
	}
	if q.Has("default_query_exec_mode") {
		// pgx's own parameter: the store sends its statements that way.
		urlOpts = append(urlOpts, WithQueryMode(cfg.ConnConfig.DefaultQueryExecMode))
	}
	CancelAtDeadline(cfg.ConnConfig)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("pgstore: %w", err)
	}
	s, err := New(ctx, pool, append(urlOpts, opts...)...)
	if err != nil {
		pool.Close()
		return nil, err
	}
	s.closeDB = pool.Close
	return s, nil
}
