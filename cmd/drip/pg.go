package main

import (
	"context"
	"flag"
	"fmt"
	"io"

	"github.com/driplimit/drip"
	"github.com/driplimit/drip/store/pgstore"
)

func init() {
	register(command{name: "pg", brief: "PostgreSQL: install or migrate drip's schema and SQL functions", run: runPG})
}

// openPostgres opens a postgres:// or postgresql:// store URL (see
// pgstore.Open for drip's own URL parameters).
func openPostgres(ctx context.Context, url string) (drip.Store, func(), error) {
	s, err := pgstore.Open(ctx, url)
	if err != nil {
		return nil, nil, err
	}
	return s, func() { s.Close() }, nil
}

func runPG(ctx context.Context, args []string, _ io.Reader, stdout, stderr io.Writer) int {
	usage := func() {
		fmt.Fprintln(stderr, `usage: drip pg install --url postgres://... [--unlogged | --logged]

install creates the drip schema in the database (the table drip.buckets and
the functions drip.take, drip.peek, drip.refund, drip.reset, ...), or
migrates an older one; running it again is harmless.`)
	}
	if len(args) == 0 || args[0] != "install" {
		usage()
		if len(args) > 0 && (args[0] == "-h" || args[0] == "--help" || args[0] == "help") {
			return 0
		}
		return 2
	}
	fs := flag.NewFlagSet("pg install", flag.ContinueOnError)
	fs.SetOutput(stderr)
	url := fs.String("url", envOr("DRIP_STORE", ""), "PostgreSQL URL (env DRIP_STORE)")
	unlogged := fs.Bool("unlogged", false, "make the bucket table UNLOGGED: faster, emptied by a crash (up to one extra burst per key)")
	logged := fs.Bool("logged", false, "make an UNLOGGED bucket table logged again")
	if err := fs.Parse(args[1:]); err != nil {
		return 2
	}
	if *url == "" {
		fmt.Fprintln(stderr, "drip pg install: --url is required")
		return 2
	}
	pool, err := pgstore.NewPool(ctx, *url)
	if err != nil {
		fmt.Fprintln(stderr, "drip pg install:", err)
		return 1
	}
	defer pool.Close()
	if err := pgstore.Install(ctx, pool, pgstore.InstallOptions{Unlogged: *unlogged, Logged: *logged}); err != nil {
		fmt.Fprintln(stderr, "drip pg install:", err)
		return 1
	}
	fmt.Fprintf(stdout, "drip schema version %d installed\n", pgstore.SchemaVersion)
	return 0
}
