package pgstore

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/driplimit/drip/store"
)

// Overrides (package override) live in drip.overrides, with a version
// number in drip.overrides_version that every change bumps and a NOTIFY
// on the channel overridesChannel at its commit (sql/003_overrides.sql),
// and a record of the latest changes in drip.override_changes for
// OverridesSince (sql/004_override_changes.sql).
// Their statements are rare and prepare nothing by name, so they run
// through a pooler in transaction mode as they are.

var _ store.Overrides = (*Store)(nil)

const overridesChannel = "drip_overrides"

// odb is the store's pool for the override statements.
func (s *Store) odb() DB { return newModeDB(s.dbm.db, FallbackQueryMode) }

// PutOverride implements store.Overrides. The version row, updated first,
// serializes changes, so the number of overrides it keeps (held), which
// bounds them, is exact.
func (s *Store) PutOverride(ctx context.Context, key string, val []byte, max int) error {
	return pgx.BeginFunc(ctx, s.odb(), func(tx pgx.Tx) error {
		if err := bumpVersion(ctx, tx, []byte(key)); err != nil {
			return err
		}
		var added bool
		err := tx.QueryRow(ctx, `INSERT INTO drip.overrides (key, value)
SELECT $1::bytea, $2::bytea
WHERE EXISTS (SELECT 1 FROM drip.overrides WHERE key = $1::bytea) OR (SELECT held FROM drip.overrides_version) < $3::bigint
ON CONFLICT (key) DO UPDATE SET value = excluded.value
RETURNING xmax = 0`, []byte(key), val, max).Scan(&added)
		if errors.Is(err, pgx.ErrNoRows) {
			return store.ErrOverridesFull // rolls the version back
		}
		if err != nil {
			return err
		}
		if added {
			if _, err := tx.Exec(ctx, "UPDATE drip.overrides_version SET held = held + 1"); err != nil {
				return err
			}
		}
		_, err = tx.Exec(ctx, "SELECT pg_notify($1::text, '')", overridesChannel)
		return err
	})
}

// errNotFound rolls back the version bump of a delete of nothing.
var errNotFound = errors.New("no such override")

// DeleteOverride implements store.Overrides.
func (s *Store) DeleteOverride(ctx context.Context, key string) (bool, error) {
	err := pgx.BeginFunc(ctx, s.odb(), func(tx pgx.Tx) error {
		if err := bumpVersion(ctx, tx, []byte(key)); err != nil {
			return err
		}
		tag, err := tx.Exec(ctx, "DELETE FROM drip.overrides WHERE key = $1::bytea", []byte(key))
		if err != nil {
			return err
		}
		if tag.RowsAffected() == 0 {
			return errNotFound
		}
		if _, err := tx.Exec(ctx, "UPDATE drip.overrides_version SET held = held - 1"); err != nil {
			return err
		}
		_, err = tx.Exec(ctx, "SELECT pg_notify($1::text, '')", overridesChannel)
		return err
	})
	if errors.Is(err, errNotFound) {
		return false, nil
	}
	return err == nil, err
}

// bumpVersion bumps the version of the overrides for a change of key (a
// lock on the version row to the end of the transaction: changes are
// serialized), records the change, and trims the record to the latest
// store.KeepChanges. A version beyond the latest recorded one was
// changed by a drip that records none (nor keeps held): the record then
// holds nothing before this change, and held is counted afresh.
func bumpVersion(ctx context.Context, tx pgx.Tx, key []byte) error {
	_, err := tx.Exec(ctx, `WITH v AS (
  UPDATE drip.overrides_version
  SET version = version + 1,
      floor = greatest(CASE WHEN logged = version THEN floor ELSE version END, version + 1 - $2::bigint),
      held = CASE WHEN logged = version THEN held ELSE (SELECT count(*) FROM drip.overrides) END,
      logged = version + 1
  RETURNING version
)
INSERT INTO drip.override_changes (key, version) SELECT $1::bytea, version FROM v
ON CONFLICT (key) DO UPDATE SET version = excluded.version`, key, store.KeepChanges)
	if err != nil {
		return err
	}
	_, err = tx.Exec(ctx, "DELETE FROM drip.override_changes WHERE version <= (SELECT floor FROM drip.overrides_version)")
	return err
}

// OverridesSince implements store.Overrides: one statement, so the
// version and the changes are read at one moment.
func (s *Store) OverridesSince(ctx context.Context, since int64) (int64, map[string][]byte, bool, error) {
	// Each changed key's value by its primary key: never a scan of every
	// override, whatever the planner thinks of the tables' sizes.
	rows, err := s.odb().Query(ctx, `SELECT v.version, v.logged = v.version AND $1::bigint BETWEEN v.floor AND v.version,
  c.key, (SELECT o.value FROM drip.overrides o WHERE o.key = c.key)
FROM drip.overrides_version v
LEFT JOIN drip.override_changes c ON c.version > $1::bigint AND v.logged = v.version AND $1::bigint >= v.floor`, since)
	if err != nil {
		return 0, nil, false, err
	}
	var (
		v        int64
		ok       bool
		key, val []byte
	)
	changed := make(map[string][]byte)
	_, err = pgx.ForEachRow(rows, []any{&v, &ok, &key, &val}, func() error {
		if key != nil {
			changed[string(key)] = nil
			if val != nil {
				changed[string(key)] = append([]byte(nil), val...)
			}
		}
		return nil
	})
	if err != nil || !ok {
		return v, nil, false, err
	}
	return v, changed, true, nil
}

// OverridesVersion implements store.Overrides.
func (s *Store) OverridesVersion(ctx context.Context) (int64, error) {
	var v int64
	err := s.odb().QueryRow(ctx, "SELECT version FROM drip.overrides_version").Scan(&v)
	return v, err
}

// Overrides implements store.Overrides.
func (s *Store) Overrides(ctx context.Context) (int64, map[string][]byte, error) {
	v, err := s.OverridesVersion(ctx)
	if err != nil {
		return 0, nil, err
	}
	rows, err := s.odb().Query(ctx, "SELECT key, value FROM drip.overrides")
	if err != nil {
		return 0, nil, err
	}
	all := make(map[string][]byte)
	var key, val []byte
	_, err = pgx.ForEachRow(rows, []any{&key, &val}, func() error {
		all[string(key)] = append([]byte(nil), val...)
		return nil
	})
	if err != nil {
		return 0, nil, err
	}
	return v, all, nil
}

// WatchOverrides implements store.Overrides: LISTEN on a connection of its
// own, opened with the pool's settings, for as long as ctx lasts. A store
// on a DB that is not a *pgxpool.Pool cannot open one (ErrNoWatch). Behind
// a pooler in transaction mode notifications may never arrive: polling
// covers for them.
func (s *Store) WatchOverrides(ctx context.Context, changed func()) error {
	p, ok := s.dbm.db.(interface{ Config() *pgxpool.Config })
	if !ok {
		return store.ErrNoWatch
	}
	conn, err := pgx.ConnectConfig(ctx, p.Config().ConnConfig.Copy())
	if err != nil {
		return err
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
		defer cancel()
		conn.Close(cctx)
	}()
	if _, err := conn.Exec(ctx, "LISTEN "+overridesChannel, pgx.QueryExecModeSimpleProtocol); err != nil {
		return err
	}
	changed()
	for {
		if _, err := conn.WaitForNotification(ctx); err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return errors.Join(errors.New("pgstore: LISTEN "+overridesChannel), err)
		}
		changed()
	}
}
