package pgstore_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/driplimit/drip/internal/testkit/testserver"
	"github.com/driplimit/drip/store"
	"github.com/driplimit/drip/store/pgstore"
	"github.com/driplimit/drip/storetest"
)

// TestTLS runs the suite's calls (storetest.RunTransport: the store is
// held to the whole suite by TestConformance, on the same server code)
// over sslmode=verify-full with a certificate from a throwaway CA, and
// wants a wrong CA or a wrong host name to fail at once with an error
// that says so.
func TestTLS(t *testing.T) {
	ca := testserver.NewCA(t, "drip-test")
	cert, key := ca.Issue(t, ca.Dir(t), "localhost")
	pg := testserver.StartPostgresTLS(t, cert, key)
	url := func(host, params string) string {
		return fmt.Sprintf("postgres://postgres@%s:%d/postgres?%s", host, pg.Port(), params)
	}
	good := url("localhost", "sslmode=verify-full&sslrootcert="+ca.CAFile)
	st := openVia(t, good, "")
	var ssl bool
	if err := mustPool(t, good).QueryRow(context.Background(), "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()").Scan(&ssl); err != nil || !ssl {
		t.Fatalf("a connection with the store's URL is not TLS: %v %v", ssl, err)
	}
	storetest.RunTransport(t, func(t *testing.T) store.Store { return st })

	other := testserver.NewCA(t, "other")
	for _, c := range []struct{ name, url, want string }{
		{"wrong CA", url("localhost", "sslmode=verify-full&sslrootcert="+other.CAFile), "certificate signed by unknown authority"},
		{"wrong host", url("127.0.0.1", "sslmode=verify-full&sslrootcert="+ca.CAFile), "127.0.0.1"},
		{"no CA (system roots)", url("localhost", "sslmode=verify-full"), "certificate"},
	} {
		t.Run(c.name, func(t *testing.T) {
			begin := time.Now()
			s, err := pgstore.Open(context.Background(), c.url+"&drip_install=true")
			took := time.Since(begin)
			if err == nil {
				s.Close()
				t.Fatalf("opened")
			}
			t.Logf("%v after %v", err, took.Round(time.Millisecond))
			if !strings.Contains(err.Error(), c.want) {
				t.Errorf("error %q does not say %q", err, c.want)
			}
			if took > 10*time.Second {
				t.Errorf("took %v to fail", took)
			}
		})
	}
}
