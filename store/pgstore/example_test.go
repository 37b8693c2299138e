package pgstore_test

import (
	"context"
	"fmt"
	"os"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/driplimit/drip"
	"github.com/driplimit/drip/store/pgstore"
)

// The store on a pool the application already has. The schema is
// installed once, by drip pg install --url ... or, as here, when the store
// opens.
func Example() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	store, err := pgstore.New(ctx, pool, pgstore.WithInstall(pgstore.InstallOptions{}))
	if err != nil {
		panic(err)
	}
	defer store.Close()

	limiter := drip.New(store, drip.PerSecond(10).WithBurst(20))
	d, err := limiter.Take(ctx, "user:1")
	if err != nil {
		panic(err) // the store failed: decide what to do (allow, deny, fall back)
	}
	fmt.Println(d.Allowed, d.Remaining)
}

// A URL opens a pool of the store's own; drip's parameters ride along.
func ExampleOpen() {
	ctx := context.Background()
	store, err := pgstore.Open(ctx, "postgres://app@db/app?drip_install=true&drip_batch_conns=2")
	if err != nil {
		panic(err)
	}
	defer store.Close()
}
