package pgstore_test

import (
	"testing"

	"github.com/driplimit/drip/internal/testserver"
	"github.com/driplimit/drip/store"
	"github.com/driplimit/drip/store/pgstore"
	"github.com/driplimit/drip/storetest"
)

// TestBlocks holds the blocks of leased limits on PostgreSQL to the exact
// model: one statement a call, with batching on (leased calls bypass the
// batcher) and off, and through PgBouncer in transaction mode.
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
			st := newStore(t, mode.opts...)
			storetest.RunBlocks(t, func(t *testing.T) store.Store { return st })
		})
	}
	t.Run("pgbouncer", func(t *testing.T) {
		bouncer := testserver.StartPgBouncer(t, testserver.SharedPostgres(t), 0)
		st := openVia(t, bouncer.URL(), "")
		storetest.RunBlocks(t, func(t *testing.T) store.Store { return st })
	})
}
