package drip_test

import (
	"context"
	"encoding/json"
	"errors"
	"go/build"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/driplimit/drip"
	"github.com/driplimit/drip/store/memstore"
)

func TestLimitValidate(t *testing.T) {
	good := []drip.Limit{drip.PerSecond(10), drip.PerMinute(0.5).WithBurst(3), drip.Per(5, 10*time.Second).WithRefill(drip.Interval),
		drip.PerHour(100).Window(), drip.PerSecond(1).WithMaxReserved(10),
		drip.PerSecond(10).WithLeased(true), drip.PerHour(100).Window().WithLeased(true)}
	for _, l := range good {
		if err := l.Validate(); err != nil {
			t.Errorf("%v: %v", l, err)
		}
	}
	bad := map[string]drip.Limit{
		"rate must be > 0":                    {},
		"rate must be a finite number":        {Rate: float64Inf()},
		"period must be > 0":                  {Rate: 1, Period: -1},
		"burst must be > 0":                   {Rate: 1, Burst: -2},
		"refill applies to token_bucket only": {Rate: 1, Algorithm: drip.FixedWindow, Refill: drip.Interval},
		"is not token_bucket, fixed_window, sliding_window or concurrency": {Rate: 1, Algorithm: "gcra"},
		"rate must be at least 0.000001":                                   {Rate: 1e-9},
		"a concurrency limit is not leased":                                drip.InFlight(3, 0).WithLeased(true),
		"a sliding_window is not leased":                                   {Algorithm: drip.SlidingWindow, Rate: 5, Leased: true},
	}
	for want, l := range bad {
		err := l.Validate()
		if !errors.Is(err, drip.ErrInvalidLimit) || !strings.Contains(err.Error(), want) {
			t.Errorf("%+v: err = %v, want %q", l, err, want)
		}
	}
}

func float64Inf() float64 { var z float64; return 1 / z }

func TestLimitString(t *testing.T) {
	for l, want := range map[drip.Limit]string{
		drip.PerSecond(10): "10/1s burst 10",
		drip.Per(5, 10*time.Second).WithBurst(20).WithRefill(drip.Interval): "5/10s burst 20 interval",
		drip.PerMinute(3).Window(): "fixed_window 3/1m0s burst 3",
	} {
		if got := l.String(); got != want {
			t.Errorf("String() = %q, want %q", got, want)
		}
	}
}

func TestLimitJSON(t *testing.T) {
	var l drip.Limit
	if err := json.Unmarshal([]byte(`{"algorithm":"fixed_window","rate":5,"period":"10s","burst":20,"start":0}`), &l); err != nil {
		t.Fatal(err)
	}
	if l.Period != 10*time.Second || l.Start != 10*time.Second || l.Burst != 20 {
		t.Errorf("decoded %+v", l)
	}
	if err := json.Unmarshal([]byte(`{"rate":5,"period":2.5}`), &l); err != nil || l.Period != 2500*time.Millisecond {
		t.Errorf("period in seconds: %+v %v", l, err)
	}
	if err := json.Unmarshal([]byte(`{"rate":5,"perod":"1s"}`), &l); err == nil {
		t.Error("an unknown field must be an error")
	}
	if err := json.Unmarshal([]byte(`{"rate":5,"period":"soon"}`), &l); err == nil {
		t.Error("a bad period must be an error")
	}
	b, _ := json.Marshal(drip.PerSecond(10).WithBurst(20))
	if string(b) != `{"rate":10,"period":"1s","burst":20}` {
		t.Errorf("marshal: %s", b)
	}
	// Leased is the program's (or the rules file's) to set, never a
	// limit's JSON: a client of the decision API cannot move a bucket.
	if b, _ := json.Marshal(drip.PerSecond(10).WithLeased(true)); string(b) != `{"rate":10,"period":"1s"}` {
		t.Errorf("marshal of a leased limit: %s", b)
	}
	if err := json.Unmarshal([]byte(`{"rate":5,"leased":true}`), &l); err == nil {
		t.Error(`"leased" in a limit's JSON must be an error`)
	}
}

func TestLimiter(t *testing.T) {
	s := memstore.New()
	defer s.Close()
	now := time.Unix(1000, 0)
	l := drip.New(s, drip.PerSecond(2).WithBurst(3).WithMaxReserved(2), drip.WithClock(func() time.Time { return now }))
	ctx := context.Background()
	for i := range 3 {
		if d, err := l.Take(ctx, "u"); err != nil || !d.Allowed {
			t.Fatalf("take %d: %+v %v", i, d, err)
		}
	}
	if d, _ := l.Peek(ctx, "u"); d.Allowed || d.RetryAfter != 500*time.Millisecond {
		t.Fatalf("peek on empty: %+v", d)
	}
	if d, _ := l.Reserve(ctx, "u", 2); !d.Allowed || d.RetryAfter != time.Second {
		t.Fatalf("reserve: %+v", d)
	}
	if d, _ := l.Reserve(ctx, "u", 1); d.Allowed {
		t.Fatalf("a reservation past max_reserved must be denied: %+v", d)
	}
	if d, _ := l.Refund(ctx, "u", 2); d.Tokens != 0 {
		t.Fatalf("refund: %+v", d)
	}
	if err := l.Reset(ctx, "u"); err != nil {
		t.Fatal(err)
	}
	_, _ = l.Take(ctx, "u")
	m, err := l.TakeMulti(ctx, drip.Request{Key: "u", Cost: 3}, drip.Request{Key: "t", Limit: drip.PerSecond(1).WithBurst(2), Cost: 2}, drip.Request{Key: "v", Limit: drip.PerSecond(1), Cost: 1})
	if err != nil || m.Allowed {
		t.Fatalf("multi: %+v %v", m, err)
	}
	if !m.Decisions[1].Allowed || m.Decisions[0].Allowed {
		t.Fatalf("per-request results: %+v", m)
	}
	if d, _ := l.PeekN(ctx, "t", 2); !d.Allowed {
		t.Fatalf("the denied multi-take consumed: %+v", d)
	}
}

// TestWait runs Wait in a synctest bubble: virtual time, no real sleeping.
func TestWait(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := memstore.New(memstore.WithSweep(0))
		defer s.Close()
		l := drip.New(s, drip.PerSecond(10), drip.WithClock(time.Now))
		ctx := context.Background()
		start := time.Now()
		var done atomic.Int64
		for range 15 {
			go func() {
				if err := l.Wait(ctx, "w"); err != nil {
					t.Error(err)
				}
				done.Add(1)
			}()
		}
		synctest.Wait()
		if done.Load() != 10 {
			t.Fatalf("at once: %d of 15 passed, want the burst of 10", done.Load())
		}
		time.Sleep(500 * time.Millisecond)
		synctest.Wait()
		if done.Load() != 15 {
			t.Fatalf("after 0.5 s: %d passed, want 15", done.Load())
		}
		if el := time.Since(start); el != 500*time.Millisecond {
			t.Fatalf("virtual time %v", el)
		}
		// A deadline too short for the wait: refused, and nothing kept.
		dctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
		defer cancel()
		err := l.Wait(dctx, "w")
		if !errors.Is(err, drip.ErrWouldExceedDeadline) || !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("err = %v, want one that is both ErrWouldExceedDeadline and context.DeadlineExceeded", err)
		}
		if d, _ := l.Peek(ctx, "w"); d.RetryAfter != 100*time.Millisecond {
			t.Fatalf("the refused wait kept its reservation: %+v", d)
		}
		// A wait above the burst is a reservation too; refused for the
		// deadline, it is refunded in full (a refund may exceed the burst).
		big := drip.New(s, drip.Limit{Rate: 4, Burst: 1}, drip.WithClock(time.Now))
		if err := big.WaitN(dctx, "big", 5); !errors.Is(err, drip.ErrWouldExceedDeadline) {
			t.Fatalf("WaitN(5) on a burst of 1: err = %v", err)
		}
		if d, _ := big.PeekN(ctx, "big", 0); d.Tokens != 1 {
			t.Fatalf("the refused WaitN(5) kept its reservation: %+v", d)
		}
	})
}

// TestCoreImportsStdlibOnly keeps the core packages free of dependencies
// and the arrows between them pointing one way: drip imports the standard
// library, bucket, store, internal/seconds and internal/calendar (the
// windows of calendar periods); store imports the standard library and
// bucket; bucket, internal/seconds and internal/calendar the standard
// library only.
func TestCoreImportsStdlibOnly(t *testing.T) {
	for dir, allowed := range map[string][]string{
		".":                 {"github.com/driplimit/drip/bucket", "github.com/driplimit/drip/store", "github.com/driplimit/drip/internal/seconds", "github.com/driplimit/drip/internal/calendar"},
		"store":             {"github.com/driplimit/drip/bucket"},
		"bucket":            nil,
		"internal/seconds":  nil,
		"internal/calendar": nil,
	} {
		pkg, err := build.ImportDir(dir, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, imp := range pkg.Imports {
			if strings.Contains(strings.Split(imp, "/")[0], ".") && !slices.Contains(allowed, imp) {
				t.Errorf("package %s imports %s: the core must use the standard library only", pkg.Name, imp)
			}
		}
	}
}
