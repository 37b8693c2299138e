package pgstore

import (
	"context"
	"errors"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// How the store sends its statements. By default it starts with pgx's
// QueryExecModeCacheStatement: each statement is prepared once per
// connection under a name, so the server plans it once (the statements
// are long; BENCHMARKS.md has what each of pgx's modes costs on a direct
// connection). A pooler in transaction mode (PgBouncer before 1.21, or
// without max_prepared_statements; RDS Proxy and the like) hands each
// transaction a server connection of its choice, where a statement
// prepared on another is missing (SQLSTATE 26000) or one of the same name
// already exists (42P05). The first time the server answers either, the
// store switches for good to FallbackQueryMode, which prepares nothing by
// name (each statement is parsed as the unnamed statement in the same
// round trip as its execution), and runs the statement again: nothing of
// it ran, as both errors come before execution. So a plain postgres:// URL
// works directly and through such a pooler alike.
const (
	DefaultQueryMode  = pgx.QueryExecModeCacheStatement
	FallbackQueryMode = pgx.QueryExecModeCacheDescribe
)

// WithQueryMode makes the store send every statement with mode m, always
// (no switch on a pooler's errors), whatever the pool's own default. Open
// takes it from the URL's default_query_exec_mode when the URL names one.
func WithQueryMode(m pgx.QueryExecMode) Option {
	return func(c *config) { c.queryMode, c.queryModeSet = m, true }
}

// modeDB sends every statement of db with the mode in mode, through pgx's
// per-call override (a QueryExecMode as the first argument), those
// without arguments too (pgx's Query would otherwise use the pool's
// default mode for them).
type modeDB struct {
	db   DB
	mode *atomic.Int32 // a pgx.QueryExecMode
}

func newModeDB(db DB, m pgx.QueryExecMode) modeDB {
	md := modeDB{db: db, mode: new(atomic.Int32)}
	md.mode.Store(int32(m))
	return md
}

// fallBack reports whether err is a pooler's answer to a named prepared
// statement and the store may switch modes; if so it switches to
// FallbackQueryMode (if it had not already: statements sent before the
// switch may fail after it), and the statement may be run again, once.
func (s *Store) fallBack(err error) bool {
	if s.cfg.queryModeSet {
		return false
	}
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || (pe.Code != "26000" && pe.Code != "42P05") {
		return false
	}
	s.dbm.mode.Store(int32(FallbackQueryMode))
	return true
}

// QueryMode is how the store sends its statements now.
func (s *Store) QueryMode() pgx.QueryExecMode { return pgx.QueryExecMode(s.dbm.mode.Load()) }

func (m modeDB) args(args []any) []any {
	return append([]any{pgx.QueryExecMode(m.mode.Load())}, args...)
}

func (m modeDB) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	return m.db.Exec(ctx, sql, m.args(args)...)
}

func (m modeDB) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	return m.db.Query(ctx, sql, m.args(args)...)
}

func (m modeDB) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	return m.db.QueryRow(ctx, sql, m.args(args)...)
}

func (m modeDB) Begin(ctx context.Context) (pgx.Tx, error) {
	tx, err := m.db.Begin(ctx)
	if err != nil {
		return nil, err
	}
	return modeTx{Tx: tx, m: m}, nil
}

// modeTx is a transaction of a modeDB: its statements go with the same
// mode.
type modeTx struct {
	pgx.Tx
	m modeDB
}

func (t modeTx) args(args []any) []any { return t.m.args(args) }

func (t modeTx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	return t.Tx.Exec(ctx, sql, t.args(args)...)
}

func (t modeTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	return t.Tx.Query(ctx, sql, t.args(args)...)
}

func (t modeTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	return t.Tx.QueryRow(ctx, sql, t.args(args)...)
}
