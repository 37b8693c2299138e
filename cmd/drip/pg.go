package main

import (
	"context"
	"fmt"
	"io"
	"strings"

	"github.com/driplimit/drip/internal/redact"
	"github.com/driplimit/drip/store"
	"github.com/driplimit/drip/store/pgstore"
)

func init() {
	register(command{name: "pg", brief: "PostgreSQL: install or migrate drip's schema and SQL functions", run: runPG})
}

// openPostgres opens a postgres:// or postgresql:// store URL (see
// pgstore.Open for drip's own URL parameters).
func openPostgres(ctx context.Context, url string) (store.Store, func(), error) {
	s, err := pgstore.Open(ctx, url)
	if err != nil {
		return nil, nil, err
	}
	return s, func() { s.Close() }, nil
}

func runPG(ctx context.Context, args []string, _ io.Reader, stdout, stderr io.Writer) int {
	fs := newFlagSet("pg install")
	url := fs.String("url", envOr("DRIP_STORE", ""), "PostgreSQL URL, postgres://... or postgresql://... (env DRIP_STORE)")
	urlFile := fs.String("url-file", envOr("DRIP_STORE_FILE", ""), "file holding the PostgreSQL URL, which may hold a password (a mounted Secret, say); not with --url (env DRIP_STORE_FILE)")
	unlogged := fs.Bool("unlogged", false, "make the bucket table UNLOGGED: faster, emptied by a crash (up to one extra burst per key)")
	logged := fs.Bool("logged", false, "make an UNLOGGED bucket table logged again")
	if len(args) > 0 && (args[0] == "-h" || args[0] == "--help" || args[0] == "help") {
		printUsage(fs, pgUsage, stdout) // the flags are install's, the only subcommand
		return 0
	}
	if len(args) == 0 || args[0] != "install" {
		if len(args) > 0 {
			fmt.Fprintf(stderr, "drip pg: unknown subcommand %q\n", args[0])
		}
		fmt.Fprint(stderr, pgUsage)
		return 2
	}
	if code, done := parseFlags(fs, pgUsage, args[1:], stdout, stderr); done {
		return code
	}
	fail := func(code int, format string, a ...any) int {
		fmt.Fprintf(stderr, "drip pg install: "+format+"\n", a...)
		return code
	}
	if *urlFile != "" {
		if *url != "" {
			return fail(2, "--url and --url-file (or DRIP_STORE and DRIP_STORE_FILE) both set: give one")
		}
		u, err := readToken(*urlFile)
		if err != nil {
			return fail(2, "--url-file: %v", err)
		}
		*url = u
	}
	switch {
	case fs.NArg() > 0:
		return fail(2, "unexpected arguments %q", fs.Args())
	case *url == "":
		return fail(2, "--url is required (a postgres://... URL)")
	case !strings.HasPrefix(*url, "postgres://") && !strings.HasPrefix(*url, "postgresql://"):
		return fail(2, "--url %s is not a PostgreSQL URL: want postgres://user@host/db (Redis needs no install)", redact.URL(*url))
	case *unlogged && *logged:
		return fail(2, "--unlogged and --logged: choose one")
	}
	pool, err := pgstore.NewPool(ctx, *url)
	if err != nil {
		return fail(1, "%v", redact.Error(err))
	}
	defer pool.Close()
	if err := pgstore.Install(ctx, pool, pgstore.InstallOptions{Unlogged: *unlogged, Logged: *logged}); err != nil {
		return fail(1, "%v", redact.Error(err))
	}
	var persistence string
	if err := pool.QueryRow(ctx, "SELECT relpersistence::text FROM pg_class WHERE oid = 'drip.buckets'::regclass").Scan(&persistence); err != nil {
		return fail(1, "reading back the bucket table: %v", redact.Error(err))
	}
	tables := "logged tables"
	if persistence == "u" {
		tables = "UNLOGGED tables (faster; a crash empties them: every key full again, every slot free)"
	}
	fmt.Fprintf(stdout, "drip schema version %d installed: drip.buckets and drip.leases are %s; drip.overrides and drip.override_changes hold drip serve's per-tenant limits; with the functions drip.take, drip.peek, drip.refund and drip.reset\n", pgstore.SchemaVersion, tables)
	return 0
}
