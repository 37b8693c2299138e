package pgstore_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/driplimit/drip"
	"github.com/driplimit/drip/bucket"
	"github.com/driplimit/drip/internal/testkit/testserver"
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
// by Install keeps its buckets as they were, holds a key's blocks in its
// own row, and keeps the table unlogged when the install was.
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
			if err := db.QueryRow(ctx, "SELECT (SELECT max(version) FROM drip.schema_version), (SELECT relpersistence::text FROM pg_class WHERE oid = 'drip.buckets'::regclass)").Scan(&v, &rel); err != nil {
				t.Fatal(err)
			}
			if wantRel := map[string]string{"": "p", "UNLOGGED": "u"}[persistence]; v != pgstore.SchemaVersion || rel != wantRel {
				t.Fatalf("version %d, drip.buckets persistence %q; want %d, %q", v, rel, pgstore.SchemaVersion, wantRel)
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
			if err := st.Apply(ctx, bucket.Take, at, []bucket.Prepared{it}, res); err != nil || !res[0].Allowed || res[0].Tokens != bucket.Micro {
				t.Fatalf("a block of 3 of k: %+v, %v; want 1 left (the key's one bucket)", res[0], err)
			}
		})
	}
}

// TestMigrateBlocksIntoBuckets: a schema at version 7 (a leased limit's
// bucket and blocks in drip.blocks, apart from drip.buckets) migrated by
// Install: each key has one bucket, its blocks in its row and capping
// every request; a key that had both buckets keeps the lesser tokens at
// the later time; a sliding window's row of a leased key is replaced.
func TestMigrateBlocksIntoBuckets(t *testing.T) {
	ctx := context.Background()
	db := schemaAt(t, 7, "")
	at := time.Unix(1_700_000_000, 0)
	ns := func(d time.Duration) int64 { return at.Add(d).UnixNano() }
	for _, q := range []struct {
		sql  string
		args []any
	}{
		// a: leased only, 2 tokens and a block of 3 until +10s.
		{"INSERT INTO drip.blocks VALUES ('a', 2000000, $1, '{b1}', '{3000000}', ARRAY[$2::bigint], $2)", []any{ns(0), ns(10 * time.Second)}},
		// m: a plain bucket of 8 at 'at' and a leased one of 5 a second before.
		{"INSERT INTO drip.buckets (key, tokens, ts, expires) VALUES ('m', 8000000, $1, $2)", []any{ns(0), ns(2 * time.Second)}},
		{"INSERT INTO drip.blocks VALUES ('m', 5000000, $1, '{}', '{}', '{}', $2)", []any{ns(-time.Second), ns(4 * time.Second)}},
		// s: a sliding window's row, and a leased bucket of 1.
		{"INSERT INTO drip.buckets (key, tokens, ts, expires, counts) VALUES ('s', 0, 5, $1, '{1000000,1000000}')", []any{ns(time.Minute)}},
		{"INSERT INTO drip.blocks VALUES ('s', 1000000, $1, '{}', '{}', '{}', $2)", []any{ns(0), ns(9 * time.Second)}},
	} {
		if _, err := db.Exec(ctx, q.sql, q.args...); err != nil {
			t.Fatalf("%s: %v", q.sql, err)
		}
	}
	if err := pgstore.Install(ctx, db, pgstore.InstallOptions{}); err != nil {
		t.Fatal(err)
	}
	var gone bool
	if err := db.QueryRow(ctx, "SELECT to_regclass('drip.blocks') IS NULL").Scan(&gone); err != nil || !gone {
		t.Fatalf("drip.blocks still there (%v)", err)
	}
	st, err := pgstore.New(ctx, db, pgstore.WithSweep(0))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	lim := drip.PerSecond(1).WithBurst(10)
	for _, c := range []struct {
		what   string
		op     bucket.Op
		key    string
		at     time.Duration
		tokens float64
	}{
		{"a: its 2 tokens, 3 more a second later (a peek of 1 leaves 2)", bucket.Peek, "a", time.Second, 2},
		{"a: refilled under the block's cap, 7, not 10", bucket.Peek, "a", 9 * time.Second, 6},
		{"m: the lesser tokens at the later time", bucket.Peek, "m", 0, 4},
		{"s: the leased bucket, not the window", bucket.Peek, "s", 0, 0},
	} {
		d, err := storetest.Apply(ctx, st, c.op, at.Add(c.at), drip.Request{Key: c.key, Limit: lim, Cost: 1})
		if err != nil || d.Tokens != c.tokens {
			t.Errorf("%s: %+v, %v; want %v tokens", c.what, d, err, c.tokens)
		}
	}
	p, err := lim.Params("a")
	if err != nil {
		t.Fatal(err)
	}
	it, err := store.PrepareBlock(bucket.Refund, "a", p, 3*bucket.Micro, "b1", 0)
	if err != nil {
		t.Fatal(err)
	}
	res := make([]bucket.Result, 1)
	if err := st.Apply(ctx, bucket.Refund, at.Add(9*time.Second), []bucket.Prepared{it}, res); err != nil || res[0].Tokens != 10*bucket.Micro {
		t.Fatalf("a: the block of 3 back unused at +9s: %+v, %v; want 10 tokens", res[0], err)
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
	if err := db.QueryRow(ctx, "SELECT version FROM drip.schema_version").Scan(&v); err != nil || v != pgstore.SchemaVersion || v != 9 {
		t.Fatalf("schema version %d (%v), want 9", v, err)
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
// migrated by Install (the notice board, migration 9) keeps its buckets,
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
			if v != pgstore.SchemaVersion || v != 9 || rel != "p" {
				t.Fatalf("version %d, drip.board persistence %q; want 9, \"p\"", v, rel)
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
