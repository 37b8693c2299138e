package server

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/driplimit/drip"
	"github.com/driplimit/drip/bucket"
	"github.com/driplimit/drip/internal/testkit/testserver"
	"github.com/driplimit/drip/store"
	"github.com/driplimit/drip/store/redisstore"
	"github.com/driplimit/drip/storetest"
)

// TestReadyzTLS serves on a store reached over TLS (rediss://, and
// postgres:// with sslmode=verify-full), then restarts the store's server
// with a certificate from another CA, as a botched rotation would: every
// /readyz answers within the store deadline, and says 503 with the
// certificate error.
func TestReadyzTLS(t *testing.T) {
	for _, kind := range []string{"redis", "postgres"} {
		t.Run(kind, func(t *testing.T) {
			ca := testserver.NewCA(t, "drip-test")
			dir := ca.Dir(t)
			cert, key := ca.Issue(t, dir, "localhost")
			var store store.Store
			var restart func()
			switch kind {
			case "redis":
				r, port := testserver.StartRedisTLS(t, cert, key)
				s, err := redisstore.Open(fmt.Sprintf("rediss://localhost:%d?tls_ca_file=%s", port, ca.CAFile))
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { s.Close() })
				store = s
				restart = func() {
					r.Kill()
					testserver.NewCA(t, "other").Issue(t, dir, "localhost")
					if err := r.Start(); err != nil {
						t.Fatal(err)
					}
				}
			case "postgres":
				pg := testserver.StartPostgresTLS(t, cert, key)
				store = openPostgres(t, fmt.Sprintf("postgres://postgres@localhost:%d/postgres?sslmode=verify-full&sslrootcert=%s", pg.Port(), ca.CAFile))
				restart = func() {
					if err := pg.Stop(); err != nil {
						t.Fatal(err)
					}
					testserver.NewCA(t, "other").Issue(t, dir, "localhost")
					if err := pg.Start(); err != nil {
						t.Fatal(err)
					}
				}
			}
			const timeout = 2 * time.Second
			srv := start(t, Config{Rules: rulesFile(t, "", 3, "api"), WatchEvery: -1, StoreTimeout: timeout}, store)
			if code, out := call(t, "GET", srv.admin+"/readyz", ""); code != 200 {
				t.Fatalf("/readyz over TLS: %d %s", code, out)
			}
			restart()
			// The first answers may report the connections the restart
			// broke; then the handshake's error.
			for deadline := time.Now().Add(20 * time.Second); ; {
				begin := time.Now()
				code, out := call(t, "GET", srv.admin+"/readyz", "")
				if took := time.Since(begin); took > timeout+2*time.Second {
					t.Errorf("/readyz took %v with a store deadline of %v", took, timeout)
				}
				if code != 503 {
					t.Fatalf("/readyz with a certificate from another CA: %d %s", code, out)
				}
				if strings.Contains(out, "certificate signed by unknown authority") {
					t.Logf("/readyz: %s", out)
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("/readyz does not report the certificate: %s", out)
				}
				time.Sleep(100 * time.Millisecond)
			}
			// Decisions fail too (never decided without the store).
			ctx, cancel := context.WithTimeout(context.Background(), timeout)
			defer cancel()
			if _, err := storetest.Apply(ctx, store, bucket.Take, time.Time{}, drip.Request{Key: "k", Limit: drip.PerSecond(1), Cost: 1}); err == nil {
				t.Errorf("a decision with a certificate from another CA succeeded")
			}
		})
	}
}
