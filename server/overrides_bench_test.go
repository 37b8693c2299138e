package server

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/driplimit/drip"
	"github.com/driplimit/drip/internal/testkit/testserver"
	"github.com/driplimit/drip/override"
	"github.com/driplimit/drip/store"
	"github.com/driplimit/drip/store/memstore"
	"github.com/driplimit/drip/store/redisstore"
)

// BenchmarkOverridePut is one override's PUT through the admin API (the
// store's change, this instance's snapshot brought up to date, the stale
// check) with n overrides held, on each store: its cost must not grow
// with n. The stores are servers of the benchmark's own.
func BenchmarkOverridePut(b *testing.B) {
	stores := []struct {
		name string
		open func(b *testing.B, n int) store.Store
	}{
		{"memory", func(b *testing.B, n int) store.Store {
			st := memstore.New()
			b.Cleanup(func() { st.Close() })
			fillOverrides(b, st, n)
			return st
		}},
		{"redis", func(b *testing.B, n int) store.Store {
			st, err := redisstore.Open(testserver.StartRedis(b).URL())
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { st.Close() })
			fillOverrides(b, st, n)
			return st
		}},
		{"postgres", func(b *testing.B, n int) store.Store {
			pg := testserver.StartPostgres(b)
			st := openPostgres(b, pg.URL())
			// One transaction per override would take minutes (changes
			// are serialized): the rows as PutOverride writes them.
			pool, err := pgxpool.New(context.Background(), pg.URL())
			if err != nil {
				b.Fatal(err)
			}
			defer pool.Close()
			if _, err := pool.Exec(context.Background(), `INSERT INTO drip.overrides (key, value)
SELECT convert_to('api|k' || i, 'UTF8'), convert_to(format('{"rule":"api","values":["k%s"],"key":"api|k%s","limit":{"rate":5,"period":"1h","burst":5}}', i, i), 'UTF8')
FROM generate_series(0, $1::int - 1) i`, n); err != nil {
				b.Fatal(err)
			}
			if _, err := pool.Exec(context.Background(), `UPDATE drip.overrides_version
SET version = version + 1, logged = version + 1, floor = version + 1, held = $1::int`, n); err != nil {
				b.Fatal(err)
			}
			return st
		}},
	}
	for _, s := range stores {
		for _, n := range []int{1_000, 100_000} {
			b.Run(fmt.Sprintf("%s/overrides=%d", s.name, n), func(b *testing.B) {
				st := s.open(b, n)
				srv := start(b, Config{Rules: rulesFile(b, "", 3, "api"), WatchEvery: -1, AdminToken: adminToken}, st)
				if got := srv.ovr.Snapshot().Len(); got != n {
					b.Fatalf("%d overrides in force, want %d", got, n)
				}
				b.ReportAllocs()
				for i := 0; b.Loop(); i++ {
					body := fmt.Sprintf(`{"rate": %d}`, 1+i%7)
					req, _ := http.NewRequest("PUT", fmt.Sprintf("%s/v1/admin/overrides/api/k%d", srv.admin, i*7919%n), strings.NewReader(body))
					req.Header.Set("Authorization", "Bearer "+adminToken)
					resp, err := http.DefaultClient.Do(req)
					if err != nil {
						b.Fatal(err)
					}
					resp.Body.Close()
					if resp.StatusCode != 200 {
						b.Fatalf("PUT: %d", resp.StatusCode)
					}
				}
			})
		}
	}
}

// fillOverrides stores n overrides of rule api, for keys k0 ... k<n-1>,
// from a few goroutines.
func fillOverrides(b *testing.B, st store.Store, n int) {
	ost := st.Caps().Overrides
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for w := range 8 {
		wg.Go(func() {
			for i := w; i < n; i += 8 {
				v := fmt.Sprint("k", i)
				e := override.Entry{Rule: "api", Values: []string{v}, Key: "api|" + v, Limit: drip.Limit{Rate: 5, Burst: 5}}
				if err := override.Set(context.Background(), ost, e); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		b.Fatal(err)
	}
}
