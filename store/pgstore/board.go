package pgstore

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/driplimit/drip/store"
)

// The notice board (store.Board) lives in drip.board
// (sql/009_board.sql), dated by the server's clock. A put deletes the
// expired rows and counts the live ones under a lock on the table, so
// the bound on instances is exact; its statements are rare and prepare
// nothing by name, as the overrides' do.

var _ store.Board = (*Store)(nil)

// PutBoard implements store.Board.
func (s *Store) PutBoard(ctx context.Context, instance string, blob []byte, ttl time.Duration) error {
	if err := store.CheckNotice(instance, blob, ttl); err != nil {
		return err
	}
	return pgx.BeginFunc(ctx, s.odb(), func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "LOCK TABLE drip.board IN SHARE ROW EXCLUSIVE MODE"); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, "DELETE FROM drip.board WHERE expires <= clock_timestamp()"); err != nil {
			return err
		}
		var put bool
		err := tx.QueryRow(ctx, `INSERT INTO drip.board (instance, blob, put, expires)
SELECT $1::text, $2::bytea, clock_timestamp(), clock_timestamp() + $3::bigint * interval '1 microsecond'
WHERE EXISTS (SELECT 1 FROM drip.board WHERE instance = $1::text) OR (SELECT count(*) FROM drip.board) < $4::bigint
ON CONFLICT (instance) DO UPDATE SET blob = excluded.blob, put = excluded.put, expires = excluded.expires
RETURNING true`, instance, blob, ttl.Microseconds(), store.MaxBoardInstances).Scan(&put)
		if errors.Is(err, pgx.ErrNoRows) {
			return store.ErrBoardFull
		}
		return err
	})
}

// ReadBoard implements store.Board.
func (s *Store) ReadBoard(ctx context.Context) ([]store.Notice, error) {
	rows, err := s.odb().Query(ctx, `SELECT instance, blob, (extract(epoch FROM clock_timestamp() - put) * 1000000)::bigint
FROM drip.board WHERE expires > clock_timestamp() ORDER BY instance LIMIT $1::bigint`, store.MaxBoardInstances)
	if err != nil {
		return nil, err
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (store.Notice, error) {
		var n store.Notice
		var us int64
		err := r.Scan(&n.Instance, &n.Blob, &us)
		n.Age = time.Duration(us) * time.Microsecond
		return n, err
	})
	return out, err
}
