package drip_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/driplimit/drip"
	"github.com/driplimit/drip/bucket"
	"github.com/driplimit/drip/internal/testkit/testclock"
	"github.com/driplimit/drip/store"
	"github.com/driplimit/drip/store/memstore"
)

// TestNewPanicsOnInvalidLimit: a limiter that would refuse every request
// fails where it is made, saying why; Validate says the same without the
// panic, for limits read from configuration.
func TestNewPanicsOnInvalidLimit(t *testing.T) {
	s := memstore.New(memstore.WithSweep(0))
	defer s.Close()
	for _, l := range []drip.Limit{{}, drip.PerSecond(math.NaN()), drip.PerSecond(10).WithBurst(-1), {Rate: 1, Algorithm: "leaky"}} {
		err := l.Validate()
		if !errors.Is(err, drip.ErrInvalidLimit) {
			t.Fatalf("%+v: Validate = %v, want ErrInvalidLimit", l, err)
		}
		func() {
			defer func() {
				msg := fmt.Sprint(recover())
				if !strings.HasPrefix(msg, "drip.New: ") || !strings.HasSuffix(msg, err.Error()) {
					t.Fatalf("%+v: New panicked with %q, want drip.New: %v", l, msg, err)
				}
			}()
			drip.New(s, l)
		}()
	}
	drip.New(s, drip.PerSecond(10)) // a valid limit does not panic
}

// TestPreparedPath: a Limiter, which prepares its limit once in New,
// decides exactly as drip.Apply, which prepares each request, errors
// included.
func TestPreparedPath(t *testing.T) {
	at := time.Unix(1_000_000, 0)
	clock := drip.WithClock(func() time.Time { return at })
	limits := []drip.Limit{
		drip.PerSecond(3).WithBurst(5).WithMaxReserved(2),
		drip.Per(2, time.Second).WithRefill(drip.Interval),
		drip.PerMinute(4).Window(), // key-dependent: no prepared path
		drip.PerSecond(0.5).WithBurst(0.5),
	}
	for _, lim := range limits {
		a, b := memstore.New(memstore.WithSweep(0)), memstore.New(memstore.WithSweep(0))
		l := drip.New(a, lim, clock)
		ctx := context.Background()
		apply := func(op bucket.Op, r drip.Request) (drip.Decision, error) {
			r.Limit = lim
			m, err := drip.Apply(ctx, b, op, at, r)
			if err != nil {
				return drip.Decision{}, err
			}
			return m.Decisions[0], nil
		}
		type call struct {
			lim func(key string, cost float64) (drip.Decision, error)
			req func(key string, cost float64) (drip.Decision, error)
		}
		calls := []call{
			{func(k string, c float64) (drip.Decision, error) { return l.TakeN(ctx, k, c) },
				func(k string, c float64) (drip.Decision, error) {
					return apply(bucket.Take, drip.Request{Key: k, Cost: c})
				}},
			{func(k string, c float64) (drip.Decision, error) { return l.Reserve(ctx, k, c) },
				func(k string, c float64) (drip.Decision, error) {
					return apply(bucket.Take, drip.Request{Key: k, Cost: c, Reserve: true})
				}},
			{func(k string, c float64) (drip.Decision, error) { return l.PeekN(ctx, k, c) },
				func(k string, c float64) (drip.Decision, error) {
					return apply(bucket.Peek, drip.Request{Key: k, Cost: c})
				}},
			{func(k string, c float64) (drip.Decision, error) { return l.Refund(ctx, k, c) },
				func(k string, c float64) (drip.Decision, error) {
					return apply(bucket.Refund, drip.Request{Key: k, Cost: c})
				}},
		}
		costs := []float64{1, 0, 0.25, 2, 7, -1, math.NaN()}
		keys := []string{"a", "b", "", strings.Repeat("k", 600), strings.Repeat("k", 1025)}
		for i := range 400 {
			at = at.Add(time.Duration(i%7) * 97 * time.Millisecond)
			c, k, cost := calls[i%len(calls)], keys[i%len(keys)], costs[i%len(costs)]
			d1, err1 := c.lim(k, cost)
			d2, err2 := c.req(k, cost)
			if d1 != d2 || fmt.Sprint(err1) != fmt.Sprint(err2) {
				t.Fatalf("%v, call %d (key %.8q, cost %v): Limiter %+v, %v; drip.Apply %+v, %v", lim, i, k, cost, d1, err1, d2, err2)
			}
		}
		a.Close()
		b.Close()
	}
}

func TestAcquireRelease(t *testing.T) {
	s := memstore.New(memstore.WithSweep(0))
	now := time.Unix(1_000_000, 0)
	l := drip.New(s, drip.InFlight(2, time.Minute), drip.WithClock(func() time.Time { return now }))
	ctx := context.Background()
	a, err := l.Acquire(ctx, "k")
	if err != nil || !a.Allowed || a.Remaining != 1 || len(a.ID) != 22 {
		t.Fatalf("first acquire: %+v %v", a, err)
	}
	b, _ := l.Acquire(ctx, "k")
	c, err := l.Acquire(ctx, "k")
	if err != nil || c.Allowed || c.RetryAfter != time.Minute {
		t.Fatalf("third acquire: %+v %v, want denied for a minute", c, err)
	}
	if err := c.Release(ctx); err != nil {
		t.Fatalf("release of a denied lease: %v", err)
	}
	if err := a.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if d, _ := l.Acquire(ctx, "k"); !d.Allowed {
		t.Fatal("no slot after a release")
	}
	// b never releases: its slot comes back a minute after it was taken.
	now = now.Add(time.Minute)
	if d, _ := l.Acquire(ctx, "k"); !d.Allowed {
		t.Fatal("no slot after the lease TTL")
	}
	_ = b
	if _, err := l.Take(ctx, "k"); !errors.Is(err, store.ErrInvalidLease) {
		t.Errorf("Take on a concurrency limit: %v, want ErrInvalidLease", err)
	}
}

// TestAllowAsTake: Allow decides as Take does, on the memory store's own
// path and on the general one (a limit keyed by name, a wrapped store),
// and leaves the same buckets: two stores on one clock, one asked with
// Allow and one with Take, step by step.
func TestAllowAsTake(t *testing.T) {
	limits := map[string]drip.Limit{
		"continuous":          drip.PerSecond(10).WithBurst(5),
		"fractional":          drip.Per(2.5, 3*time.Second).WithBurst(3.5),
		"interval":            {Rate: 3, Period: time.Second, Burst: 6, Refill: drip.Interval},
		"window":              {Algorithm: drip.FixedWindow, Rate: 4, Period: time.Second, Start: time.Second},
		"window by key":       {Algorithm: drip.FixedWindow, Rate: 4, Period: time.Second},
		"burst under a token": drip.PerSecond(0.5).WithBurst(0.5),
		"sliding window":      {Algorithm: drip.SlidingWindow, Rate: 4, Period: time.Second},
	}
	// A wrapper that changes keys must not pass Allow to the store below.
	mem := memstore.New(memstore.WithSweep(0))
	defer mem.Close()
	for _, w := range []store.Store{store.Prefixed{Store: mem, Prefix: "p:"}, store.Sharded{Store: mem}, store.Separately{Store: mem}} {
		if _, ok := w.(store.Admitter); ok {
			t.Fatalf("%T is an Admitter: Allow would skip what it does to keys", w)
		}
	}
	for name, lim := range limits {
		for _, limiterClock := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/limiter clock %v", name, limiterClock), func(t *testing.T) {
				clock := testclock.New()
				mk := func() *drip.Limiter {
					if limiterClock {
						s := memstore.New(memstore.WithSweep(0))
						t.Cleanup(func() { s.Close() })
						return drip.New(s, lim, drip.WithClock(clock.Now))
					}
					s := memstore.New(memstore.WithSweep(0), memstore.WithClock(clock.Now))
					t.Cleanup(func() { s.Close() })
					return drip.New(s, lim)
				}
				a, b := mk(), mk()
				ctx := context.Background()
				rng := rand.New(rand.NewPCG(1, 2))
				keys := []string{"a", "b", "a-key-longer-than-fifteen-bytes", "", strings.Repeat("k", 1025)}
				allowed := 0
				for i := range 2000 {
					clock.Add(time.Duration(rng.IntN(300)) * time.Millisecond)
					key := keys[rng.IntN(len(keys))]
					got := a.Allow(key)
					d, err := b.Take(ctx, key)
					if want := err == nil && d.Allowed; got != want {
						t.Fatalf("step %d, key %q: Allow %v, Take %+v, %v", i, key, got, d, err)
					}
					if got {
						allowed++
					}
				}
				if allowed == 0 && name != "burst under a token" {
					t.Fatal("nothing allowed: the steps test nothing")
				}
				for _, key := range keys[:3] {
					pa, errA := a.Peek(ctx, key)
					pb, errB := b.Peek(ctx, key)
					if pa != pb || (errA == nil) != (errB == nil) {
						t.Fatalf("key %q after the steps: %+v, %v; want %+v, %v", key, pa, errA, pb, errB)
					}
				}
			})
		}
	}
}

// TestLimitJSONWindows: sliding and calendar windows read and write as
// the decision API and drip replay spell them.
func TestLimitJSONWindows(t *testing.T) {
	for _, in := range []string{
		`{"algorithm":"sliding_window","rate":100,"period":"1m0s","slots":20}`,
		`{"algorithm":"fixed_window","rate":10000,"period":"month","time_zone":"Europe/Berlin"}`,
		`{"algorithm":"fixed_window","rate":5,"period":"week"}`,
	} {
		var l drip.Limit
		if err := json.Unmarshal([]byte(in), &l); err != nil {
			t.Fatalf("%s: %v", in, err)
		}
		if err := l.Validate(); err != nil {
			t.Fatalf("%s: %v", in, err)
		}
		out, err := json.Marshal(l)
		if err != nil || string(out) != in {
			t.Errorf("%s reads and writes back as %s (%v)", in, out, err)
		}
	}
	var l drip.Limit
	for _, bad := range []string{
		`{"algorithm":"fixed_window","rate":5,"period":"week","time_zone":"Mars/Olympus"}`,
		`{"algorithm":"fixed_window","rate":5,"period":"week","time_zone":"Local"}`,
	} {
		if err := json.Unmarshal([]byte(bad), &l); !errors.Is(err, drip.ErrInvalidLimit) {
			t.Errorf("%s: err = %v, want ErrInvalidLimit", bad, err)
		}
	}
}
