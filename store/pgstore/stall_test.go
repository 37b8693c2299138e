package pgstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/driplimit/drip"
	"github.com/driplimit/drip/bucket"
	"github.com/driplimit/drip/internal/testkit/stalltest"
	"github.com/driplimit/drip/internal/testkit/testserver"
	"github.com/driplimit/drip/store/pgstore"
	"github.com/driplimit/drip/storetest"
)

// TestLockedTableTakesNothing locks drip.buckets (LOCK TABLE in another
// session) under load from callers with short deadlines: they get errors
// at their deadlines, the statements waiting at the server stay bounded
// (Open's pool cancels a statement at its deadline: with batching, at
// most InFlight wait on the lock), and once the lock is released the
// buckets show nothing taken. With a connection that cannot cancel a
// statement (a pooler in between, or a client that cannot: here a DB that
// ignores its context), the statements still refuse to apply late, by the
// deadlines they carry.
func TestLockedTableTakesNothing(t *testing.T) {
	for _, mode := range []struct {
		name     string
		opts     []pgstore.Option
		stuck    bool // a DB that ignores contexts, given to New
		inFlight int  // the bound on statements waiting at the server (0: none claimed)
	}{
		{"batching", nil, false, pgstore.DefaultBatching.InFlight},
		{"statement", []pgstore.Option{pgstore.WithoutBatching()}, false, 32},
		{"batching-uncancellable", nil, true, pgstore.DefaultBatching.InFlight},
	} {
		t.Run(mode.name, func(t *testing.T) {
			srv := testserver.StartPostgres(t)
			ctx := context.Background()
			url := withParams(srv.URL(), "pool_max_conns=40")
			opts := append([]pgstore.Option{pgstore.WithSweep(0), pgstore.WithInstall(pgstore.InstallOptions{})}, mode.opts...)
			var st *pgstore.Store
			var err error
			if mode.stuck {
				st, err = pgstore.New(ctx, uncancellable{mustPool(t, url)}, opts...)
			} else {
				st, err = pgstore.Open(ctx, url, opts...)
			}
			if err != nil {
				t.Fatal(err)
			}
			defer st.Close()
			// One decision first, so that the store knows the server's
			// clock.
			warm, cancel := context.WithTimeout(ctx, 30*time.Second)
			defer cancel()
			if _, err := storetest.Apply(warm, st, bucket.Take, time.Time{}, drip.Request{Key: "stall:warm", Limit: stalltest.Limit, Cost: 1}); err != nil {
				t.Fatal(err)
			}
			admin := mustPool(t, srv.URL())
			tx, err := admin.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := tx.Exec(ctx, "LOCK TABLE drip.buckets IN ACCESS EXCLUSIVE MODE"); err != nil {
				t.Fatal(err)
			}
			keys := []string{"stall:a", "stall:b", "stall:c"}
			res := stalltest.Run(t, st, stalltest.Load{
				Callers: 32, Deadline: 100 * time.Millisecond, For: time.Second, Keys: keys,
				Multi:   mode.inFlight > 2, // multi-takes are not batched
				Leases:  mode.inFlight > 2,
				Running: func() int { return waiting(t, admin) },
			})
			if err := tx.Rollback(ctx); err != nil {
				t.Fatal(err)
			}
			// Wait until the server has run or dropped every statement
			// that waited on the lock.
			for deadline := time.Now().Add(30 * time.Second); active(t, admin) > 0; time.Sleep(10 * time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatal("statements still running 30 s after the lock was released")
				}
			}
			t.Logf("%v (statements waiting on the lock)", res)
			// Generous: a cancel request may take a while on a loaded
			// machine (Open's pool gives up on it after a second).
			if res.Late > 3*time.Second {
				t.Errorf("callers returned up to %v after their deadline", res.Late)
			}
			if mode.inFlight > 0 && res.PeakRunning > mode.inFlight {
				t.Errorf("%d statements waited on the lock at once, want at most %d", res.PeakRunning, mode.inFlight)
			}
			stalltest.NothingTaken(t, st, keys)
		})
	}
}

// waiting is the number of statements waiting on a lock (the store's:
// nothing else runs).
func waiting(t *testing.T, admin *pgxpool.Pool) int {
	var n int
	if err := admin.QueryRow(context.Background(), `SELECT count(*) FROM pg_stat_activity
		WHERE wait_event_type = 'Lock'`).Scan(&n); err != nil {
		t.Error(err)
	}
	return n
}

// active is the number of the store's statements running (or waiting).
func active(t *testing.T, admin *pgxpool.Pool) int {
	var n int
	if err := admin.QueryRow(context.Background(), `SELECT count(*) FROM pg_stat_activity
		WHERE state = 'active' AND backend_type = 'client backend' AND pid <> pg_backend_pid()`).Scan(&n); err != nil {
		t.Error(err)
	}
	return n
}

// uncancellable is a pool whose statements ignore their contexts' ends:
// they run to completion, as through a pooler that does not pass a cancel
// on.
type uncancellable struct{ *pgxpool.Pool }

func (u uncancellable) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	return u.Pool.Exec(context.WithoutCancel(ctx), sql, args...)
}

func (u uncancellable) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	return u.Pool.Query(context.WithoutCancel(ctx), sql, args...)
}

func (u uncancellable) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	return u.Pool.QueryRow(context.WithoutCancel(ctx), sql, args...)
}
