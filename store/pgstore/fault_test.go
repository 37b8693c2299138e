package pgstore_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/driplimit/drip"
	"github.com/driplimit/drip/bucket"
	"github.com/driplimit/drip/internal/testkit/testserver"
	"github.com/driplimit/drip/store/pgstore"
	"github.com/driplimit/drip/storetest"
)

// TestServerRestart restarts the server in the middle of a load run on one
// key at one instant. Decisions during the restart fail with errors, never
// with a wrong decision: afterwards the bucket holds exactly what the
// successful takes left (plus what takes whose answer was lost on the
// dropped connection took), and the store works again.
func TestServerRestart(t *testing.T) {
	t.Parallel() // on servers of its own
	for _, mode := range []struct {
		name string
		opts []pgstore.Option
	}{
		{"statement", []pgstore.Option{pgstore.WithoutBatching()}},
		{"batching", []pgstore.Option{pgstore.WithBatching(pgstore.Batching{MaxBatch: 32, InFlight: 2})}},
	} {
		t.Run(mode.name, func(t *testing.T) {
			srv := testserver.StartPostgres(t)
			ctx := context.Background()
			st, err := pgstore.Open(ctx, withParams(srv.URL(), "pool_max_conns=16&drip_install=true"), append([]pgstore.Option{pgstore.WithSweep(0)}, mode.opts...)...)
			if err != nil {
				t.Fatal(err)
			}
			defer st.Close()
			const burst = 1_000_000
			lim := drip.PerHour(1).WithBurst(burst)
			req := drip.Request{Key: "restart", Limit: lim, Cost: 1}
			var ok, failed atomic.Int64
			stop := make(chan struct{})
			var wg sync.WaitGroup
			for range 16 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for {
						select {
						case <-stop:
							return
						default:
						}
						c, cancel := context.WithTimeout(ctx, 5*time.Second)
						d, err := storetest.Apply(c, st, bucket.Take, t0, req)
						cancel()
						switch {
						case err != nil:
							failed.Add(1)
							time.Sleep(5 * time.Millisecond)
						case !d.Allowed:
							t.Errorf("denied with %v tokens left of %v: a wrong decision", d.Tokens, burst)
						default:
							ok.Add(1)
						}
					}
				}()
			}
			// The restart lands in the load run: once takes succeed.
			for ok.Load() < 100 {
				time.Sleep(10 * time.Millisecond)
			}
			before := ok.Load()
			if err := srv.Restart(); err != nil {
				t.Fatal(err)
			}
			afterRestart := ok.Load()
			// The store recovers: successes resume (a generous deadline:
			// how fast is not what is tested).
			deadline := time.Now().Add(60 * time.Second)
			for ok.Load() < afterRestart+200 && time.Now().Before(deadline) {
				time.Sleep(10 * time.Millisecond)
			}
			close(stop)
			wg.Wait()
			if ok.Load() < afterRestart+200 {
				t.Fatalf("the store did not recover: %d successes after the restart", ok.Load()-afterRestart)
			}
			if before == 0 || failed.Load() == 0 {
				t.Fatalf("the restart did not land in the load run: %d successes before, %d errors", before, failed.Load())
			}
			d, err := storetest.Apply(ctx, st, bucket.Peek, t0, drip.Request{Key: "restart", Limit: lim, Cost: 0})
			if err != nil {
				t.Fatal(err)
			}
			used := int64(burst - d.Tokens)
			t.Logf("%d takes succeeded, %d failed, bucket used %d", ok.Load(), failed.Load(), used)
			if used < ok.Load() || used > ok.Load()+failed.Load() {
				t.Fatalf("bucket used %d tokens: want between the %d granted and granted + %d failed", used, ok.Load(), failed.Load())
			}
		})
	}
}

// TestUnloggedCrash: an UNLOGGED table is emptied by crash recovery (the
// documented cost: each key may admit one more burst); the store keeps
// working, and Install converts the table back to logged.
func TestUnloggedCrash(t *testing.T) {
	srv := testserver.StartPostgres(t)
	ctx := context.Background()
	st, err := pgstore.Open(ctx, withParams(srv.URL(), "drip_install=true&drip_unlogged=true"), pgstore.WithSweep(0))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	lim := drip.PerHour(1).WithBurst(5)
	take := func() (drip.Decision, error) {
		return storetest.Apply(ctx, st, bucket.Take, t0, drip.Request{Key: "u", Limit: lim, Cost: 5})
	}
	if d, err := take(); err != nil || !d.Allowed {
		t.Fatalf("%+v %v", d, err)
	}
	if d, err := take(); err != nil || d.Allowed {
		t.Fatalf("second burst allowed before the crash: %+v %v", d, err)
	}
	if err := srv.Kill(); err != nil {
		t.Fatal(err)
	}
	if _, err := take(); err == nil {
		t.Fatal("a decision with the server down did not fail")
	}
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	var d drip.Decision
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		if d, err = take(); err == nil || time.Now().After(deadline) {
			break
		}
	}
	if err != nil || !d.Allowed {
		t.Fatalf("after crash recovery: %+v %v, want the burst again (the unlogged table is empty)", d, err)
	}
	if err := pgstore.Install(ctx, mustPool(t, srv.URL()), pgstore.InstallOptions{Logged: true}); err != nil {
		t.Fatal(err)
	}
	var persistence string
	if err := mustPool(t, srv.URL()).QueryRow(ctx, "SELECT relpersistence::text FROM pg_class WHERE oid = 'drip.buckets'::regclass").Scan(&persistence); err != nil || persistence != "p" {
		t.Fatalf("after Install{Logged}: relpersistence %q %v", persistence, err)
	}
	if d, err := take(); err != nil || d.Allowed {
		t.Fatalf("after converting to logged: %+v %v, want the state kept", d, err)
	}
}
