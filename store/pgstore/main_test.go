package pgstore_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/driplimit/drip/internal/testkit/testserver"
	"github.com/driplimit/drip/store/pgstore"
)

func TestMain(m *testing.M) { testserver.Main(m) }

// pool connects to the shared test server, with the schema installed.
func pool(t testing.TB) *pgxpool.Pool {
	t.Helper()
	pg := testserver.SharedPostgres(t)
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(pg.URL())
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 70
	p, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	if err := pgstore.Install(ctx, p, pgstore.InstallOptions{}); err != nil {
		t.Fatal(err)
	}
	return p
}

// withParams adds query parameters (a=b&c=d) to a connection URL.
func withParams(url, params string) string {
	if strings.Contains(url, "?") {
		return url + "&" + params
	}
	return url + "?" + params
}

// mustPool connects to url.
func mustPool(t testing.TB, url string) *pgxpool.Pool {
	t.Helper()
	p, err := pgxpool.New(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

// newStore returns a store on the shared server.
func newStore(t testing.TB, opts ...pgstore.Option) *pgstore.Store {
	t.Helper()
	s, err := pgstore.New(context.Background(), pool(t), append([]pgstore.Option{pgstore.WithSweep(0)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// prefix is a fresh key prefix, so tests sharing a server keep apart.
func prefix() string { return testserver.Prefix() }

var t0 = time.Unix(1_700_000_000, 0)
