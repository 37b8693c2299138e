// Package pgstore keeps drip's buckets in PostgreSQL (and in the distributed
// SQL databases that speak its protocol: YugabyteDB, CockroachDB).
//
// Every decision is one SQL statement in one round trip, and the math of
// bucket.Eval runs inside it, in plain SQL on exact integers (int8, and
// numeric for math.go's 128-bit products): sql/eval.sql is a fragment that
// the statements include, and sql/functions.sql holds one-expression
// helpers that the planner inlines. Nothing is computed on the client
// between reading and writing a bucket.
//   - A take or refund (sql/take.sql) locks the key's row in the statement
//     (a locking read, which sees the latest version even after waiting on
//     the lock), decides once, and writes with INSERT ... ON CONFLICT DO
//     UPDATE only if the request is allowed: a denial writes nothing.
//   - A peek is one SELECT (sql/peek.sql), a reset one DELETE.
//   - A multi-take (sql/multi.sql) locks the buckets in key order (so
//     multi-takes never deadlock), decides every request and writes them
//     all only if all are allowed.
//   - Batching, on by default: concurrent Apply calls are coalesced into
//     one statement over arrays (sql/batch.sql), keys locked in key order;
//     requests for the same key are decided one after another inside the
//     statement, and each bucket is written once. A hot key then costs one
//     row lock and one write per batch instead of per request. A lone
//     request goes at once, as a single statement. See WithBatching.
//
// Only the retry and reset durations of a decision are computed in Go, from
// the bucket the statement returns, with bucket.Params.Until.
//
// Sliding windows: a key's counts per slot are its row of drip.buckets
// (the column counts, NULL for a bucket; ts is then the newest slot's
// index), so the row is locked, batched, reset and swept as a bucket's.
// The statements decide it with sql/slide.sql, bucket.EvalSliding in
// plain SQL, which the store joins in (sql/sliding.sql) only to the
// statements that carry a sliding window: the others run eval.sql alone.
// Each statement also returns the state it read, from which the store
// recomputes the decision with bucket.EvalSliding and fails with an error
// if the two disagree. A key used by both kinds reads the other kind's
// row as no state.
//
// Concurrency limits: a key has a row in drip.leases (its lock, the
// number of its leases and when the last expires) and a row per lease in
// drip.lease_holders (the lease ID and its expiry), so that an acquire or
// release costs a few index lookups whatever the number of leases held
// (sql/leases.sql). Every request on such a limit locks the key's row
// (FOR UPDATE, so two acquires of the last slot queue on it and the second
// sees the first's lease), reads what bucket.Leases summarizes, and writes
// only when allowed; the Go side checks the verdict against
// bucket.Params.EvalLeases. Single requests are batched like buckets:
// concurrent ones go in one statement (drip.lease_batch), decided one
// after another, so a hot key costs one row lock per batch; a multi-take
// with buckets is one run of sql/multi.sql, all or nothing. Keys whose
// leases all expired are swept like buckets. The SQL functions
// (drip.take, ...) do not cover concurrency limits nor sliding windows.
//
// Leased tokens (package leased): a key's live blocks are in its own row
// of drip.buckets, beside its bucket (NULL for none), so every request on
// the key is held to their cap. The plain statements (take, peek, batch,
// multi-take) decide a plain request on a key with blocks under their
// cap; a lone block take or return is batched like a plain take, the
// block calls of a batch one plpgsql statement (drip.block_batch); a
// call of several items with a block take or return, and every block
// call without batching, is one plpgsql function, drip.block_apply
// (sql/blocks.sql, blocks.go): the call's rows locked in one order, every
// item decided with bucket.EvalMultiAll's rules, all or nothing. The Go side decides
// again from the state they read and checks the verdicts.
//
// Schema. Everything lives in the schema drip: the table drip.buckets and
// the SQL functions, including drip.take, drip.peek, drip.refund and
// drip.reset for services in other languages, which share the buckets with
// the Go store (they run the same statements), and drip serve's per-tenant
// overrides (override.go). Install creates it and
// migrates it (versioned; drip pg install --url does the same); WithInstall
// does it when the store opens. The table is logged by default; an
// UNLOGGED table (InstallOptions.Unlogged) is faster, but PostgreSQL
// empties it after a crash, so each key may then admit up to one extra
// burst.
//
// Clock. A zero time means the server's clock_timestamp(), read once per
// statement, so that app instances with skewed clocks agree; a
// caller-supplied time is used as given (drip replay does). A bucket's ts
// never moves backwards: a statement whose time is behind the stored ts (it
// waited on the row lock while a later one wrote) refills nothing and
// leaves ts as it is, as bucket.Eval does.
//
// Keys. Keys are stored as bytes. A key longer than MaxKeyLen bytes (or
// starting with the byte 0xff) is stored as 0xff followed by its SHA-256, so
// every index entry stays far below PostgreSQL's limit (about 2700 bytes);
// drip.key() in SQL does the same for SQL callers.
//
// Expiry. A bucket that is full again carries no information: decisions
// treat it as fresh, and a sweeper deletes such rows SweepMargin after
// they expired, walking the table in key order in pages of 1000 rows (one
// short statement each, skipping rows that decisions hold), one pass per
// minute by default (WithSweep).
//
// Poolers. The store works unchanged through a pooler in transaction
// mode (PgBouncer, RDS Proxy): see DefaultQueryMode.
//
// Errors. Serialization failures (SQLSTATE 40001) and deadlocks (40P01),
// which distributed SQL databases raise under contention and PostgreSQL
// raises at SERIALIZABLE, are retried with bounded, jittered exponential
// backoff (WithRetry), then returned. Any other failure (a dropped
// connection, a server restart) is returned as an error, never turned into
// a decision; the pool reconnects by itself.
//
// Deadlines. A request answered with an error took nothing: a take,
// refund, multi-take or batch carries its caller's deadline in the
// server's clock (learned from the clock in earlier replies, see
// internal/batch), and a request that gets its row locks after it writes
// nothing and fails with an error that wraps context.DeadlineExceeded.
// Open's pool also cancels a statement on the server at its deadline
// (CancelAtDeadline).
package pgstore

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/driplimit/drip/bucket"
	"github.com/driplimit/drip/internal/batch"
	"github.com/driplimit/drip/store"
)

// MaxKeyLen is the longest key stored as it is; longer keys (up to
// store.MaxKeyLen, the longest any store accepts; the SQL functions take
// any length) are stored hashed (see the package doc).
const MaxKeyLen = 512

// DB is what the store needs of a connection pool. *pgxpool.Pool has it.
// It must be safe for concurrent use.
type DB interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	Begin(ctx context.Context) (pgx.Tx, error)
}

// Store is the PostgreSQL store. It is safe for concurrent use. Construct
// it with New or Open; Close stops its background work.
type Store struct {
	db  DB
	dbm modeDB // db, with the statements' query mode
	cfg config

	batch *batch.Batcher[request, result]
	clock batch.Clock // the server's clock, for deadlines

	stop     chan struct{}
	stopOnce sync.Once
	wg       sync.WaitGroup
	closeDB  func()

	retries atomic.Int64
}

var _ store.Store = (*Store)(nil)

type config struct {
	install      bool
	installOpts  InstallOptions
	sweepEvery   time.Duration
	sweepPage    int
	attempts     int
	backoff      time.Duration
	maxBackoff   time.Duration
	batching     Batching
	queryMode    pgx.QueryExecMode
	queryModeSet bool
}

// DefaultSweep is how often the sweeper walks the table (see WithSweep).
const DefaultSweep = time.Minute

// Option configures a Store.
type Option func(*config)

// WithInstall installs or migrates the schema when the store opens (see
// Install). Without it the schema must already be installed.
func WithInstall(o InstallOptions) Option {
	return func(c *config) { c.install, c.installOpts = true, o }
}

// WithSweep sets how often the sweeper walks the table deleting idle
// buckets (default DefaultSweep); 0 turns it off. The sweeper reads the
// server's clock: a store used only with caller-supplied times far from it
// (a replay of an old trace) may want it off.
func WithSweep(every time.Duration) Option { return func(c *config) { c.sweepEvery = every } }

// WithSweepPage sets how many rows one sweep statement examines (default
// 1000).
func WithSweepPage(n int) Option { return func(c *config) { c.sweepPage = max(1, n) } }

// WithRetry sets how often a statement that failed with a serialization
// failure or a deadlock is tried in all (default 10) and the first backoff
// (default 1ms; it doubles up to 100ms, each wait jittered between half and
// all of it). attempts 1 means no retry.
func WithRetry(attempts int, backoff time.Duration) Option {
	return func(c *config) { c.attempts, c.backoff = max(1, attempts), backoff }
}

// New returns a store on db, a pool the caller owns (the store does not
// close it).
func New(ctx context.Context, db DB, opts ...Option) (*Store, error) {
	s := &Store{db: db, stop: make(chan struct{})}
	s.cfg = config{sweepEvery: DefaultSweep, sweepPage: 1000, attempts: 10, backoff: time.Millisecond, maxBackoff: 100 * time.Millisecond,
		batching: DefaultBatching, queryMode: DefaultQueryMode}
	for _, o := range opts {
		o(&s.cfg)
	}
	s.dbm = newModeDB(db, s.cfg.queryMode)
	s.db = s.dbm
	if s.cfg.install {
		if err := Install(ctx, s.db, s.cfg.installOpts); err != nil {
			return nil, err
		}
	} else if err := checkVersion(ctx, newModeDB(db, FallbackQueryMode)); err != nil { // once: nothing prepared by name
		return nil, err
	}
	if s.cfg.batching.On() {
		s.batch = newBatcher(s)
	}
	if s.cfg.sweepEvery > 0 {
		s.wg.Add(1)
		go s.sweeper()
	}
	return s, nil
}

// Close stops the sweeper and the batcher, and closes the pool if Open
// made it. Decisions after Close fail.
func (s *Store) Close() error {
	s.stopOnce.Do(func() {
		close(s.stop)
		s.wg.Wait()
		if s.batch != nil {
			s.batch.Close()
		}
		if s.closeDB != nil {
			s.closeDB()
		}
	})
	return nil
}

// Retries is the number of statements retried after a serialization
// failure or deadlock since the store opened.
func (s *Store) Retries() int64 { return s.retries.Load() }

// storeKey is the stored form of key (see MaxKeyLen).
func storeKey(key string) []byte {
	if len(key) > MaxKeyLen || key[0] == 0xff {
		h := sha256.Sum256([]byte(key))
		return append([]byte{0xff}, h[:]...)
	}
	return []byte(key)
}

func nanos(at time.Time) *int64 {
	if at.IsZero() {
		return nil
	}
	n := at.UnixNano()
	return &n
}

// result is one decision as the SQL returns it: whether it was allowed,
// the bucket after it (for a denial, the bucket refilled to now) and the
// time of the decision; or that the request was late (the server reached
// it after its caller's deadline, and wrote nothing).
type result struct {
	allowed bool
	tokens  int64
	ts      int64
	now     int64
	late    bool
	// leases is, for a request on a concurrency limit, what bucket.Leases
	// summarizes of the key's leases as the statement read them.
	leases bucket.LeaseSet
	// slide is the key's stored state before the request as a sliding
	// window's (Counts nil when the key has none: no row, or a bucket's).
	slide bucket.SlidingState
	// blocked: the key's row holds blocks of leased tokens, and the
	// statement decided and wrote nothing (errBlocked).
	blocked bool
	// cap, when set, is the burst the request was decided under: its
	// key holds blocks of leased tokens (the batch statements decide
	// such keys, bucket.EvalBlocks' plain request), and the bucket
	// refills only up to the burst less their sizes.
	cap *int64
	// decided is a block take's or return's result, decided by
	// drip.block_batch and checked with bucket.EvalBlocks (blocks.go).
	decided *bucket.Result
}

// decide completes r, the statement's answer to op on p, with the Go
// math: a concurrency limit's by leaseResult, a sliding window's by
// slidingResult, a bucket's by result.
func (r result) decide(op bucket.Op, p bucket.Prepared) (bucket.Result, error) {
	if r.decided != nil {
		return *r.decided, nil
	}
	switch p.Params.Kind {
	case bucket.Concurrency:
		return r.leaseResult(op, p)
	case bucket.Sliding:
		return r.slidingResult(op, p)
	}
	return r.result(op, p), nil
}

// slidingResult completes r, a request on a sliding window, with
// bucket.EvalSliding on the state the statement read, which must agree
// with the statement's verdict and the state it left (slide.sql).
func (r result) slidingResult(op bucket.Op, p bucket.Prepared) (bucket.Result, error) {
	res, next, _ := bucket.EvalSliding(op, r.slide, r.slide.Counts != nil, p.Params.Sliding(), p.Cost, r.now)
	if res.Allowed != r.allowed || res.Tokens != r.tokens || next.Last != r.ts {
		return bucket.Result{}, fmt.Errorf("pgstore: the statement and bucket.EvalSliding disagree (a bug): statement allowed=%v tokens=%d slot=%d, EvalSliding allowed=%v tokens=%d slot=%d",
			r.allowed, r.tokens, r.ts, res.Allowed, res.Tokens, next.Last)
	}
	return res, nil
}

// result completes r as bucket.Eval does (under the blocks' cap when the
// key held blocks, as bucket.EvalBlocks does): retry and reset come from
// the bucket with the Go math (Params.Until), not from SQL.
func (r result) result(op bucket.Op, p bucket.Prepared) bucket.Result {
	n := bucket.State{Tokens: r.tokens, TS: r.ts}
	if r.cap != nil {
		p.Params.Burst = *r.cap // as bucket.EvalBlocks decides under the blocks' cap
	}
	if p.Params.Kind == bucket.Calendar {
		r.now = max(r.now, p.Params.Start) // eval.sql decides at the window's start, at the earliest
	}
	var retry time.Duration
	switch {
	case op == bucket.Refund:
	case r.allowed:
		retry = p.Params.Until(n, 0, r.now)
	default:
		retry = p.Params.Until(n, p.Params.NeedFor(p.Cost, p.Reserve), r.now)
	}
	return bucket.Result{
		Allowed:    r.allowed,
		Tokens:     r.tokens,
		RetryAfter: retry,
		ResetAfter: p.Params.Until(n, p.Params.Burst, r.now),
	}
}

// leaseResult completes r, a request on a concurrency limit, with the
// Go math (bucket.Params.EvalLeases), which must agree with the
// statement's verdict.
func (r result) leaseResult(op bucket.Op, p bucket.Prepared) (bucket.Result, error) {
	res, _ := p.Params.EvalLeases(op, r.leases, p.Lease, r.now)
	if res.Allowed != r.allowed {
		return bucket.Result{}, fmt.Errorf("pgstore: the lease statement and bucket.EvalLeases disagree (a bug): statement allowed=%v, EvalLeases allowed=%v", r.allowed, res.Allowed)
	}
	return res, nil
}

// errRace is take.sql's "not ok": the key had no row when the statement
// locked it, and a concurrent statement inserted one before it wrote.
// Nothing was written; the statement is run again at once.
var errRace = errors.New("pgstore: bucket appeared during the statement")

// Apply implements store.Store: one item by take.sql or peek.sql, or a
// concurrency limit's by the lease functions (through the batcher when
// batching); several by multi.sql, one statement, all or nothing.
func (s *Store) Apply(ctx context.Context, op bucket.Op, at time.Time, items []bucket.Prepared, results []bucket.Result) error {
	if err := store.CheckKinds(items, store.Caps{Sliding: true, Calendar: true}); err != nil {
		return err
	}
	if blockItems(items) && (s.batch == nil || !batchedBlock(items)) {
		return s.applyBlocks(ctx, op, at, items, results)
	}
	if len(items) != 1 || (items[0].Params.Kind == bucket.Concurrency && s.batch == nil) {
		// Without batching, a concurrency item is a multi-take of one.
		return s.applyMulti(ctx, op, at, items, results)
	}
	p := items[0]
	var res result
	var err error
	if s.batch != nil {
		res, err = s.batch.Do(ctx, request{op, storeKey(p.Key), p, nanos(at)})
		if errors.Is(err, batch.ErrClosed) {
			err = errClosed
		}
	} else {
		dl := batch.SendBy(ctx) // the caller's deadline, less the reply's margin
		res, err = s.applyOne(ctx, op, p, nanos(at), dl)
	}
	if errors.Is(err, errBlocked) {
		return s.applyBlocks(ctx, op, at, items, results)
	}
	if err != nil {
		return err
	}
	r, err := res.decide(op, p)
	if err != nil {
		return err
	}
	results[0] = r
	return nil
}

// Caps implements store.Store: the store holds leases, sliding and
// calendar windows and blocks of leased tokens (blocks.go), and keeps
// overrides (override.go).
func (s *Store) Caps() store.Caps {
	return store.Caps{Name: "pgstore", Leases: true, Sliding: true, Calendar: true, Blocks: true, Overrides: s, Board: s}
}

// applyOne decides one request with one statement (take.sql, peek.sql);
// a take or refund carries its caller's deadline dl (zero: none).
func (s *Store) applyOne(ctx context.Context, op bucket.Op, p bucket.Prepared, at *int64, dl time.Time) (result, error) {
	sliding := p.Params.Kind == bucket.Sliding
	sql := takeSQL
	if sliding {
		sql = takeSlidingSQL
	}
	args := []any{storeKey(p.Key), int(op), int(p.Params.Kind), p.Params.Rate, p.Params.Period,
		p.Params.Burst, maxres(p.Params), start(p.Params), p.Cost, p.Reserve, at}
	if op == bucket.Peek {
		sql = peekSQL // writes nothing: no deadline
		if sliding {
			sql = peekSlidingSQL
		}
	} else {
		if err := s.syncClock(ctx, dl); err != nil {
			return result{}, err
		}
		args = append(args, s.deadline(dl))
	}
	var res result
	err := s.retry(ctx, func() error {
		rows, err := s.db.Query(ctx, sql, args...)
		if err != nil {
			return err
		}
		n := 0
		ok := false
		for rows.Next() {
			dest := []any{&res.allowed, &res.tokens, &res.ts, &res.now, &ok}
			if op != bucket.Peek {
				dest = append(dest, &res.late)
			}
			dest = append(dest, &res.slide.Last, &res.slide.Counts, &res.blocked, &res.cap)
			if err := rows.Scan(dest...); err != nil {
				rows.Close()
				return err
			}
			n++
		}
		if err := rows.Err(); err != nil {
			return err
		}
		if n != 1 {
			return fmt.Errorf("pgstore: %d rows for one decision", n)
		}
		if at == nil {
			// now is the server's clock (late or not: a late answer
			// corrects an offset that made it late).
			s.clock.Observe(time.Now(), res.now)
		}
		if res.late {
			return errLate
		}
		if res.blocked {
			return errBlocked
		}
		if !ok {
			return errRace
		}
		return nil
	})
	return res, err
}

// Reset implements store.Store: one DELETE.
func (s *Store) Reset(ctx context.Context, key string) error {
	if err := store.CheckKey(key); err != nil {
		return err
	}
	return s.retry(ctx, func() error {
		_, err := s.db.Exec(ctx, resetSQL, storeKey(key))
		return err
	})
}
