package pgstore_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/driplimit/drip"
	"github.com/driplimit/drip/bucket"
	"github.com/driplimit/drip/internal/testserver"
	"github.com/driplimit/drip/store"
	"github.com/driplimit/drip/store/pgstore"
	"github.com/driplimit/drip/storetest"
)

// schemaAt is a pool on a database of its own whose drip schema is at
// version v: the first v migrations, as an older drip installed them
// (persistence: "" or "UNLOGGED").
func schemaAt(t *testing.T, v int, persistence string) *pgxpool.Pool {
	t.Helper()
	ctx := context.Background()
	name := "migrate_" + strings.ReplaceAll(strings.ToLower(strings.Trim(testserver.Prefix(), ":")), "-", "_")
	name = strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '_' {
			return r
		}
		return '_'
	}, name)
	admin := pool(t)
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { admin.Exec(ctx, "DROP DATABASE "+name) })
	cfg, err := pgxpool.ParseConfig(testserver.SharedPostgres(t).URL())
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.Database = name
	db, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(db.Close)
	if _, err := db.Exec(ctx, "CREATE SCHEMA drip; CREATE TABLE drip.schema_version (version int NOT NULL)"); err != nil {
		t.Fatal(err)
	}
	for i, m := range pgstore.Migrations[:v] {
		if _, err := db.Exec(ctx, strings.ReplaceAll(m, "{{PERSISTENCE}}", persistence)); err != nil {
			t.Fatalf("migration %d: %v", i+1, err)
		}
	}
	if _, err := db.Exec(ctx, "INSERT INTO drip.schema_version VALUES ($1)", v); err != nil {
		t.Fatal(err)
	}
	return db
}

// TestMigrateLeasesToRows: a schema at version 4 (a key's leases in one
// row of arrays) migrated by Install keeps every lease, with its expiry:
// the key answers as it did.
func TestMigrateLeasesToRows(t *testing.T) {
	ctx := context.Background()
	db := schemaAt(t, 4, "")
	at := time.Unix(1_700_000_000, 0)
	e1, e2 := at.Add(10*time.Second).UnixNano(), at.Add(20*time.Second).UnixNano()
	if _, err := db.Exec(ctx, `INSERT INTO drip.leases (key, ids, exps, expires) VALUES ('k', ARRAY['a', 'b'], ARRAY[$1::bigint, $2::bigint], $2::bigint)`, e1, e2); err != nil {
		t.Fatal(err)
	}
	if err := pgstore.Install(ctx, db, pgstore.InstallOptions{}); err != nil {
		t.Fatal(err)
	}
	st, err := pgstore.New(ctx, db, pgstore.WithSweep(0))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	lim := drip.InFlight(3, 10*time.Second)
	step := func(op bucket.Op, at time.Time, lease string) drip.Decision {
		t.Helper()
		d, err := storetest.Apply(ctx, st, op, at, drip.Request{Key: "k", Limit: lim, Lease: lease})
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	for _, c := range []struct {
		what  string
		op    bucket.Op
		at    time.Time
		lease string
		want  drip.Decision
	}{
		{"peek: a and b held", bucket.Peek, at, "", drip.Decision{Allowed: true, Tokens: 1, Remaining: 1, Burst: 3, ResetAfter: 20 * time.Second}},
		{"c takes the last slot", bucket.Take, at, "c", drip.Decision{Allowed: true, Burst: 3, ResetAfter: 20 * time.Second}},
		{"d waits for a", bucket.Take, at, "d", drip.Decision{Burst: 3, RetryAfter: 10 * time.Second, ResetAfter: 20 * time.Second}},
		{"b released", bucket.Refund, at, "b", drip.Decision{Allowed: true, Tokens: 1, Remaining: 1, Burst: 3, ResetAfter: 20 * time.Second}},
		{"a and c expired at +10s", bucket.Peek, at.Add(10 * time.Second), "", drip.Decision{Allowed: true, Tokens: 3, Remaining: 3, Burst: 3}},
	} {
		if got := step(c.op, c.at, c.lease); got != c.want {
			t.Errorf("%s: %+v, want %+v", c.what, got, c.want)
		}
	}
	var n int
	if err := db.QueryRow(ctx, "SELECT count(*) FROM drip.lease_holders").Scan(&n); err != nil || n != 2 {
		t.Errorf("%d lease rows (%v), want 2 (a and c)", n, err)
	}
}

// TestMigrateBlocks: a schema at version 5 (before leased limits) migrated
// by Install keeps its buckets as they were and holds leased limits in a
// table of their own, unlogged when the install was.
func TestMigrateBlocks(t *testing.T) {
	for _, persistence := range []string{"", "UNLOGGED"} {
		t.Run("persistence "+persistence, func(t *testing.T) {
			ctx := context.Background()
			db := schemaAt(t, 5, persistence)
			at := time.Unix(1_700_000_000, 0)
			// A bucket of 10/s, burst 10, at 4 tokens at 'at'.
			if _, err := db.Exec(ctx, "INSERT INTO drip.buckets (key, tokens, ts, expires) VALUES ('k', 4000000, $1::bigint, $2::bigint)",
				at.UnixNano(), at.Add(600*time.Millisecond).UnixNano()); err != nil {
				t.Fatal(err)
			}
			if err := pgstore.Install(ctx, db, pgstore.InstallOptions{Unlogged: persistence != ""}); err != nil {
				t.Fatal(err)
			}
			var v int
			var rel string
			if err := db.QueryRow(ctx, "SELECT (SELECT max(version) FROM drip.schema_version), (SELECT relpersistence::text FROM pg_class WHERE oid = 'drip.blocks'::regclass)").Scan(&v, &rel); err != nil {
				t.Fatal(err)
			}
			if wantRel := map[string]string{"": "p", "UNLOGGED": "u"}[persistence]; v != pgstore.SchemaVersion || rel != wantRel {
				t.Fatalf("version %d, drip.blocks persistence %q; want %d, %q", v, rel, pgstore.SchemaVersion, wantRel)
			}
			st, err := pgstore.New(ctx, db, pgstore.WithSweep(0))
			if err != nil {
				t.Fatal(err)
			}
			defer st.Close()
			lim := drip.PerSecond(10)
			d, err := storetest.Apply(ctx, st, bucket.Peek, at.Add(100*time.Millisecond), drip.Request{Key: "k", Limit: lim, Cost: 1})
			if err != nil || d.Tokens != 4 {
				t.Fatalf("the old bucket: %+v, %v; want 5 tokens less the peek's 1", d, err)
			}
			p, err := lim.Params("k")
			if err != nil {
				t.Fatal(err)
			}
			it, err := store.PrepareBlock(bucket.Take, "k", p, 3*bucket.Micro, "b", time.Second)
			if err != nil {
				t.Fatal(err)
			}
			res := make([]bucket.Result, 1)
			if err := st.Apply(ctx, bucket.Take, at, []bucket.Prepared{it}, res); err != nil || !res[0].Allowed || res[0].Tokens != 7*bucket.Micro {
				t.Fatalf("a block of 3 of the leased limit of k: %+v, %v; want 7 left (its own bucket)", res[0], err)
			}
		})
	}
}

// TestMigrateToSliding: a schema at version 5 migrated by Install (the
// counts of sliding windows, migration 6) keeps its buckets and leases:
// they answer as they did, and the key of a sliding window works beside
// them.
func TestMigrateToSliding(t *testing.T) {
	ctx := context.Background()
	db := schemaAt(t, 5, "")
	at := time.Unix(1_700_000_000, 0)
	// A bucket of 10 a minute holding 4, and one lease of 2 held for 30s.
	if _, err := db.Exec(ctx, `INSERT INTO drip.buckets (key, tokens, ts, expires) VALUES ('b', 4000000, $1::bigint, $2::bigint)`,
		at.UnixNano(), at.Add(36*time.Second).UnixNano()); err != nil {
		t.Fatal(err)
	}
	exp := at.Add(30 * time.Second).UnixNano()
	for _, q := range []string{`INSERT INTO drip.leases (key, n, expires) VALUES ('l', 1, $1::bigint)`,
		`INSERT INTO drip.lease_holders (key, id, exp) VALUES ('l', 'a', $1::bigint)`} {
		if _, err := db.Exec(ctx, q, exp); err != nil {
			t.Fatal(err)
		}
	}
	if err := pgstore.Install(ctx, db, pgstore.InstallOptions{}); err != nil {
		t.Fatal(err)
	}
	var v int
	if err := db.QueryRow(ctx, "SELECT version FROM drip.schema_version").Scan(&v); err != nil || v != pgstore.SchemaVersion || v != 8 {
		t.Fatalf("schema version %d (%v), want 8", v, err)
	}
	st, err := pgstore.New(ctx, db, pgstore.WithSweep(0))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	step := func(op bucket.Op, r drip.Request) drip.Decision {
		t.Helper()
		d, err := storetest.Apply(ctx, st, op, at, r)
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	win := drip.Limit{Algorithm: drip.SlidingWindow, Rate: 2, Period: time.Minute, Slots: 6}
	for _, c := range []struct {
		what string
		op   bucket.Op
		r    drip.Request
		want drip.Decision
	}{
		{"the bucket kept its 4", bucket.Peek, drip.Request{Key: "b", Limit: drip.PerMinute(10), Cost: 1},
			drip.Decision{Allowed: true, Tokens: 3, Remaining: 3, Burst: 10, ResetAfter: 42 * time.Second}},
		{"the lease kept its slot", bucket.Take, drip.Request{Key: "l", Limit: drip.InFlight(1, time.Minute), Lease: "b"},
			drip.Decision{Burst: 1, RetryAfter: 30 * time.Second, ResetAfter: 30 * time.Second}},
		// Its slots are 10s; the count leaves the window when the slot is
		// 6 slots behind: 70s on.
		{"a sliding window's first", bucket.Take, drip.Request{Key: "w", Limit: win, Cost: 2},
			drip.Decision{Allowed: true, Burst: 2, ResetAfter: 70 * time.Second}},
		{"a sliding window's next", bucket.Take, drip.Request{Key: "w", Limit: win, Cost: 1},
			drip.Decision{Burst: 2, RetryAfter: 70 * time.Second, ResetAfter: 70 * time.Second}},
	} {
		if got := step(c.op, c.r); got != c.want {
			t.Errorf("%s: %+v, want %+v", c.what, got, c.want)
		}
	}
}

// TestMigrateToBoard: a schema at version 7 (both persistences)
// migrated by Install (the notice board, migration 8) keeps its buckets,
// and its board takes and gives back an instance's blob; the board is
// logged whatever the buckets' persistence.
func TestMigrateToBoard(t *testing.T) {
	for _, persistence := range []string{"", "UNLOGGED"} {
		t.Run("persistence "+persistence, func(t *testing.T) {
			ctx := context.Background()
			db := schemaAt(t, 7, persistence)
			at := time.Unix(1_700_000_000, 0)
			if _, err := db.Exec(ctx, "INSERT INTO drip.buckets (key, tokens, ts, expires) VALUES ('k', 4000000, $1::bigint, $2::bigint)",
				at.UnixNano(), at.Add(600*time.Millisecond).UnixNano()); err != nil {
				t.Fatal(err)
			}
			if err := pgstore.Install(ctx, db, pgstore.InstallOptions{Unlogged: persistence != ""}); err != nil {
				t.Fatal(err)
			}
			var v int
			var rel string
			if err := db.QueryRow(ctx, "SELECT (SELECT max(version) FROM drip.schema_version), (SELECT relpersistence::text FROM pg_class WHERE oid = 'drip.board'::regclass)").Scan(&v, &rel); err != nil {
				t.Fatal(err)
			}
			if v != pgstore.SchemaVersion || v != 8 || rel != "p" {
				t.Fatalf("version %d, drip.board persistence %q; want 8, \"p\"", v, rel)
			}
			st, err := pgstore.New(ctx, db, pgstore.WithSweep(0))
			if err != nil {
				t.Fatal(err)
			}
			defer st.Close()
			d, err := storetest.Apply(ctx, st, bucket.Peek, at.Add(100*time.Millisecond), drip.Request{Key: "k", Limit: drip.PerSecond(10), Cost: 1})
			if err != nil || d.Tokens != 4 {
				t.Fatalf("the old bucket: %+v, %v; want 5 tokens less the peek's 1", d, err)
			}
			if err := st.PutBoard(ctx, "i1", []byte("summary"), time.Minute); err != nil {
				t.Fatal(err)
			}
			ns, err := st.ReadBoard(ctx)
			if err != nil || len(ns) != 1 || ns[0].Instance != "i1" || string(ns[0].Blob) != "summary" {
				t.Fatalf("the board: %+v, %v", ns, err)
			}
		})
	}
}
