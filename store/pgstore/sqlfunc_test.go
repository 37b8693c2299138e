package pgstore_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/driplimit/drip"
	"github.com/driplimit/drip/bucket"
	"github.com/driplimit/drip/store"
	"github.com/driplimit/drip/store/memstore"
	"github.com/driplimit/drip/storetest"
)

// sqlTake calls drip.take (or drip.peek, drip.refund) through SQL, as a
// service in another language would.
func sqlCall(t *testing.T, db *pgxpool.Pool, fn, key string, l drip.Limit, cost float64, reserve bool, at time.Time) drip.Decision {
	t.Helper()
	refill := string(l.Refill)
	if refill == "" {
		refill = "continuous"
	}
	alg := string(l.Algorithm)
	if alg == "" {
		alg = "token_bucket"
	}
	var burst *float64
	if l.Burst != 0 {
		burst = &l.Burst
	}
	period := l.Period
	if period == 0 {
		period = time.Second
	}
	var start *time.Duration
	if l.Start != 0 {
		start = &l.Start
	}
	var d drip.Decision
	var retry, reset float64
	var sql string
	var args []any
	if fn == "refund" {
		sql = "SELECT * FROM drip.refund($1, $2, $3, $4, $5, refill => $6, algorithm => $7, start => $8, at => $9)"
		args = []any{key, l.Rate, period, burst, cost, refill, alg, start, at}
		if l.Algorithm == drip.FixedWindow {
			sql = "SELECT * FROM drip.refund($1, $2, $3, $4, $5, algorithm => $6, start => $7, at => $8)"
			args = []any{key, l.Rate, period, burst, cost, alg, start, at}
		}
	} else {
		sql = "SELECT * FROM drip." + fn + "($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)"
		if l.Algorithm == drip.FixedWindow {
			refill = ""
		}
		var r *string
		if refill != "" {
			r = &refill
		}
		args = []any{key, l.Rate, period, burst, cost, reserve, r, alg, l.MaxReserved, start, at}
	}
	if err := db.QueryRow(context.Background(), sql, args...).Scan(&d.Allowed, &d.Tokens, &d.Remaining, &d.Burst, &retry, &reset); err != nil {
		t.Fatalf("%s: %v", fn, err)
	}
	d.RetryAfter = time.Duration(retry*1e9 + 0.5)
	d.ResetAfter = time.Duration(reset*1e9 + 0.5)
	return d
}

// TestSQLFunctions: drip.take, drip.peek, drip.refund and drip.reset,
// called through SQL, decide as the Go store does (times to the
// nanosecond, as seconds in float8), on the same buckets.
func TestSQLFunctions(t *testing.T) {
	st := newStore(t)
	db := pool(t)
	ctx := context.Background()
	p := prefix()
	mem := memstore.New(memstore.WithSweep(0))
	defer mem.Close()
	limits := []drip.Limit{
		drip.PerSecond(10).WithBurst(20),
		{Rate: 7, Period: 3 * time.Second, Burst: 5},
		{Rate: 5, Period: 10 * time.Second, Burst: 20, Refill: drip.Interval},
		{Algorithm: drip.FixedWindow, Rate: 3, Period: time.Minute},
		{Algorithm: drip.FixedWindow, Rate: 3, Period: time.Minute, Start: 17 * time.Second},
		{Rate: 2, Burst: 4, MaxReserved: 3},
	}
	near := func(a, b time.Duration) bool { return (a - b).Abs() <= time.Microsecond }
	for li, l := range limits {
		key := p + "k" + string(rune('a'+li))
		at := t0
		for i := range 40 {
			at = at.Add(time.Duration(i%7) * 113 * time.Millisecond)
			cost := []float64{1, 0.5, 2, 3.25}[i%4]
			reserve := i%5 == 0
			op, fn := bucket.Take, "take"
			switch i % 6 {
			case 3:
				op, fn = bucket.Peek, "peek"
			case 5:
				op, fn, reserve = bucket.Refund, "refund", false
			}
			want, werr := storetest.Apply(ctx, mem, op, at, drip.Request{Key: key, Limit: l, Cost: cost, Reserve: reserve})
			if werr != nil {
				continue // bad input: tested below
			}
			got := sqlCall(t, db, fn, key, l, cost, reserve, at)
			if got.Allowed != want.Allowed || got.Tokens != want.Tokens || got.Remaining != want.Remaining ||
				got.Burst != want.Burst || !near(got.RetryAfter, want.RetryAfter) || !near(got.ResetAfter, want.ResetAfter) {
				t.Fatalf("limit %v step %d %s cost %v reserve %v:\nsql  %+v\ngo   %+v", l, i, fn, cost, reserve, got, want)
			}
			// The Go store sees what SQL wrote.
			peek, err := storetest.Apply(ctx, st, bucket.Peek, at, drip.Request{Key: key, Limit: l, Cost: 0.5})
			if err != nil {
				t.Fatal(err)
			}
			mpeek, _ := storetest.Apply(ctx, mem, bucket.Peek, at, drip.Request{Key: key, Limit: l, Cost: 0.5})
			if peek != mpeek {
				t.Fatalf("limit %v step %d: the Go store reads %+v after SQL, want %+v", l, i, peek, mpeek)
			}
		}
	}

	// Reservations at their bound: a denied bounded reservation waits
	// only until the debt fits (Params.NeedFor), and unbounded debt stops
	// at 1e12 tokens instead of overflowing.
	for li, seq := range []struct {
		l     drip.Limit
		costs []float64
	}{
		{drip.Limit{Rate: 2, Burst: 4, MaxReserved: 3}, []float64{4, 3, 1, 1, 2}},
		{drip.Limit{Rate: 1e12, Burst: 1e12}, []float64{1e12, 1e12, 1e12, 1, 0.5e12}},
	} {
		key := p + "r" + string(rune('a'+li))
		for i, cost := range seq.costs {
			want, err := storetest.Apply(ctx, mem, bucket.Take, t0, drip.Request{Key: key, Limit: seq.l, Cost: cost, Reserve: true})
			if err != nil {
				t.Fatal(err)
			}
			got := sqlCall(t, db, "take", key, seq.l, cost, true, t0)
			if got.Allowed != want.Allowed || got.Tokens != want.Tokens || !near(got.RetryAfter, want.RetryAfter) || !near(got.ResetAfter, want.ResetAfter) {
				t.Fatalf("reservations %v step %d cost %v:\nsql  %+v\ngo   %+v", seq.l, i, cost, got, want)
			}
		}
	}

	// A reservation above the burst is refunded in full, up to the burst.
	rl := drip.Limit{Rate: 4, Burst: 1}
	if d := sqlCall(t, db, "take", p+"refund", rl, 5, true, t0); !d.Allowed || d.Tokens != -4 {
		t.Fatalf("sql reservation of 5 on a burst of 1: %+v", d)
	}
	if d := sqlCall(t, db, "refund", p+"refund", rl, 5, false, t0); !d.Allowed || d.Tokens != 1 {
		t.Fatalf("sql refund of 5 on a burst of 1: %+v", d)
	}
	// A cost rounds up, as in Go: 0.0000001 is one micro-token, not free.
	if d := sqlCall(t, db, "take", p+"tiny", drip.PerHour(1).WithBurst(2), 0.0000001, false, t0); !d.Allowed || d.Tokens != 1.999999 {
		t.Fatalf("sql take of 0.0000001: %+v, want 1.999999 tokens", d)
	}

	// A long key through SQL and through Go is the same bucket.
	long := p + strings.Repeat("y", 900) // over MaxKeyLen: stored hashed
	l := drip.PerHour(1).WithBurst(2)
	if d := sqlCall(t, db, "take", long, l, 1, false, t0); !d.Allowed || d.Tokens != 1 {
		t.Fatalf("sql take on a long key: %+v", d)
	}
	if d, err := storetest.Apply(ctx, st, bucket.Take, t0, drip.Request{Key: long, Limit: l, Cost: 1}); err != nil || !d.Allowed || d.Tokens != 0 {
		t.Fatalf("go take after sql on a long key: %+v %v", d, err)
	}
	var had bool
	if err := db.QueryRow(ctx, "SELECT drip.reset($1)", long).Scan(&had); err != nil || !had {
		t.Fatalf("drip.reset: %v %v", had, err)
	}
	if d := sqlCall(t, db, "peek", long, l, 0, false, t0); d.Tokens != 2 {
		t.Fatalf("after drip.reset: %+v", d)
	}

	// The example of the issue, on the server's clock.
	var allowed bool
	var remaining int64
	if err := db.QueryRow(ctx, "SELECT allowed, remaining FROM drip.take($1, 10, '1 second', 20, 1)", p+"user:1").Scan(&allowed, &remaining); err != nil || !allowed || remaining != 19 {
		t.Fatalf("drip.take('user:1', 10, '1 second', 20, 1): %v %v %v", allowed, remaining, err)
	}

	// Bad input is an error, as in Go.
	for _, bad := range []string{
		"SELECT * FROM drip.take('', 10)",
		"SELECT * FROM drip.take('k', 0)",
		"SELECT * FROM drip.take('k', 10, '0 seconds')",
		"SELECT * FROM drip.take('k', 10, '1 second', 5, 6)",
		"SELECT * FROM drip.take('k', 10, cost => -1)",
		"SELECT * FROM drip.take('k', 10, refill => 'sometimes')",
		// A reservation above burst + max_reserved could never fit.
		"SELECT * FROM drip.take('k', 4, burst => 1, cost => 5, reserve => true, max_reserved => 3)",
		"SELECT * FROM drip.peek('k', 4, burst => 1, cost => 5, reserve => true, max_reserved => 3)",
		// An op that is none of take, peek, refund.
		"SELECT * FROM drip.decide(3, 'k', 10, '1 second', NULL, 1, false, NULL, NULL, 0, NULL, NULL)",
	} {
		if _, err := db.Exec(ctx, bad); err == nil || !strings.Contains(err.Error(), "drip:") {
			t.Errorf("%s: want a drip error, got %v", bad, err)
		}
	}
}

// TestSQLFunctionsUnderBlocks: on a key whose row holds blocks of leased
// tokens (a Go instance leases the key), drip.take, drip.peek and
// drip.refund decide under the blocks' cap, as the memory store does.
func TestSQLFunctionsUnderBlocks(t *testing.T) {
	st := newStore(t)
	db := pool(t)
	ctx := context.Background()
	mem := memstore.New(memstore.WithSweep(0))
	defer mem.Close()
	key := prefix() + "k"
	l := drip.PerSecond(10).WithBurst(20)
	p, err := l.Params(key)
	if err != nil {
		t.Fatal(err)
	}
	near := func(a, b time.Duration) bool { return (a - b).Abs() <= time.Microsecond }
	for i, s := range []struct {
		block string // a block's take or return, through the Go stores; "": SQL
		op    bucket.Op
		cost  float64
		at    time.Duration
	}{
		{"a", bucket.Take, 8, 0},
		{"", bucket.Take, 12, 0},
		{"", bucket.Take, 1, 0}, // denied: 8 are out
		{"", bucket.Peek, 1, 1500 * time.Millisecond},
		{"", bucket.Take, 13, 1500 * time.Millisecond}, // an early denial: 12, not 15
		{"", bucket.Refund, 3, 1500 * time.Millisecond},
		{"a", bucket.Refund, 5, 1600 * time.Millisecond},
		{"", bucket.Take, 2, 1600 * time.Millisecond},
	} {
		at := t0.Add(s.at)
		if s.block != "" {
			it, err := store.PrepareBlock(s.op, key, p, int64(s.cost*bucket.Micro), s.block, time.Minute)
			if err != nil {
				t.Fatal(err)
			}
			for _, x := range []store.Store{st, mem} {
				if err := x.Apply(ctx, s.op, at, []bucket.Prepared{it}, make([]bucket.Result, 1)); err != nil {
					t.Fatal(err)
				}
			}
			continue
		}
		fn := map[bucket.Op]string{bucket.Take: "take", bucket.Peek: "peek", bucket.Refund: "refund"}[s.op]
		want, err := storetest.Apply(ctx, mem, s.op, at, drip.Request{Key: key, Limit: l, Cost: s.cost})
		if err != nil {
			t.Fatal(err)
		}
		got := sqlCall(t, db, fn, key, l, s.cost, false, at)
		if got.Allowed != want.Allowed || got.Tokens != want.Tokens || got.Remaining != want.Remaining ||
			got.Burst != want.Burst || !near(got.RetryAfter, want.RetryAfter) || !near(got.ResetAfter, want.ResetAfter) {
			t.Errorf("step %d %s cost %v:\nsql  %+v\ngo   %+v", i, fn, s.cost, got, want)
		}
	}
}
