package engine_test

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/driplimit/drip"
	"github.com/driplimit/drip/bucket"
	"github.com/driplimit/drip/engine"
	"github.com/driplimit/drip/internal/testkit/testclock"
	"github.com/driplimit/drip/internal/testkit/testserver"
	"github.com/driplimit/drip/internal/testkit/teststores"
	"github.com/driplimit/drip/store"
	"github.com/driplimit/drip/store/leased"
	"github.com/driplimit/drip/store/pgstore"
	"github.com/driplimit/drip/store/redisstore"
)

// countedStore counts the calls that reach a store.
type countedStore struct {
	store.Store
	calls atomic.Int64
}

func (c *countedStore) Apply(ctx context.Context, op bucket.Op, at time.Time, items []bucket.Prepared, results []bucket.Result) error {
	c.calls.Add(1)
	return c.Store.Apply(ctx, op, at, items, results)
}

// denialStores are the shared stores (every store but memory, which the
// engine does not wrap: it denies as fast itself).
func denialStores() []teststores.Store {
	var out []teststores.Store
	for _, s := range teststores.Shared() {
		if s.Name != "memory" {
			out = append(out, s)
		}
	}
	openPG := func(t *testing.T, url string) store.Store {
		sep := "?"
		if strings.Contains(url, "?") {
			sep = "&"
		}
		s, err := pgstore.Open(context.Background(), url+sep+"drip_install=true&drip_sweep=0")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		return store.Prefixed{Store: s, Prefix: testserver.Prefix()}
	}
	return append(out,
		teststores.Store{Name: "pgbouncer", Open: func(t *testing.T) store.Store {
			return openPG(t, testserver.StartPgBouncer(t, testserver.SharedPostgres(t), 0).URL())
		}},
		teststores.Store{Name: "redis-sentinel", Open: func(t *testing.T) store.Store {
			s, err := redisstore.Open(testserver.StartRedisSentinel(t).URL(), redisstore.WithPrefix(testserver.Prefix()))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { s.Close() })
			return s
		}},
	)
}

// TestLocalDenials: on every shared store, plain and leased, a key over
// its limit is denied without a store call until the instant the store's
// denial proved (the clock is the test's), and taken at it; a reset
// through the engine's store clears the proof; a call of two limits, one
// of them over, is denied locally once the store has answered it, and a
// refund of the saturated key sends it to the store again.
func TestLocalDenials(t *testing.T) {
	for _, s := range denialStores() {
		for _, lease := range []bool{false, true} {
			name := s.Name
			if lease {
				name += "/leased"
			}
			t.Run(name, func(t *testing.T) {
				clk := testclock.At(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)) // leased's janitor reads it too
				clock := clk.Now
				c := &countedStore{Store: s.Open(t)}
				var st store.Store = c
				if lease {
					ls, err := leased.New(c, leased.WithClock(clock))
					if err != nil {
						t.Fatal(err)
					}
					t.Cleanup(func() { ls.Close() })
					st = ls
				}
				e := engine.New(st, engine.WithClock(clock), engine.WithTimeout(teststores.Timeout), engine.WithDenials(0, time.Hour))
				defer e.Close()
				ctx := context.Background()
				hot := drip.Request{Key: "hot", Limit: drip.Limit{Rate: 1, Period: time.Second, Burst: 3}, Cost: 1}
				take := func(reqs ...drip.Request) drip.Multi {
					t.Helper()
					m, err := e.Apply(ctx, bucket.Take, reqs, nil)
					if err != nil {
						t.Fatal(err)
					}
					return m
				}
				var m drip.Multi
				for range 10 {
					if m = take(hot); !m.Allowed {
						break
					}
				}
				if m.Allowed {
					t.Fatal("never denied")
				}
				calls := c.calls.Load()
				until := clk.Now().Add(m.RetryAfter)
				// (A continuous refill's proof stops a nanosecond short of
				// the answer's instant: semantics.md, "Local denials".)
				for _, step := range []time.Duration{0, m.RetryAfter / 3, m.RetryAfter - 2} {
					clk.Set(until.Add(step - m.RetryAfter))
					if d := take(hot); d.Allowed || d.RetryAfter != until.Sub(clk.Now()) {
						t.Fatalf("%v before the proven instant: %+v", until.Sub(clk.Now()), d)
					}
				}
				if n := c.calls.Load(); n != calls {
					t.Fatalf("%d store calls before the proven instant", n-calls)
				}
				// At the answer's instant the store is asked: it allows (or
				// denies for at most a micro-token's refill time, 1 µs
				// here, should its clock's grain fall so).
				clk.Set(until)
				d := take(hot)
				if c.calls.Load() == calls {
					t.Fatal("decided at the proven instant without asking the store")
				}
				if !d.Allowed {
					if d.RetryAfter > 2*time.Microsecond {
						t.Fatalf("at the proven instant: %+v", d)
					}
					clk.Add(d.RetryAfter)
					if d = take(hot); !d.Allowed {
						t.Fatalf("at the store's instant: %+v", d)
					}
				}

				// A reset clears the proof.
				for take(hot).Allowed {
				}
				if err := e.Store().Reset(ctx, hot.Key); err != nil {
					t.Fatal(err)
				}
				if d := take(hot); !d.Allowed {
					t.Fatalf("after a reset: %+v", d)
				}

				// Two limits, one over: denied by the store once, then
				// locally; a refund of the hot key asks the store again.
				for take(hot).Allowed {
				}
				other := drip.Request{Key: "other", Limit: drip.Limit{Rate: 100, Period: time.Second, Burst: 100}, Cost: 1}
				first := take(other, hot)
				if first.Allowed {
					t.Fatalf("two limits, one over: %+v", first)
				}
				calls = c.calls.Load()
				if again := take(other, hot); again.Allowed || again.Decisions[1].Allowed || !again.Decisions[0].Allowed ||
					again.Decisions[0].Tokens != first.Decisions[0].Tokens || c.calls.Load() != calls {
					t.Fatalf("two limits again: %+v after %+v, %d store calls", again, first, c.calls.Load()-calls)
				}
				if _, err := e.Apply(ctx, bucket.Refund, []drip.Request{hot}, nil); err != nil {
					t.Fatal(err)
				}
				if d := take(other, hot); !d.Allowed {
					t.Fatalf("after a refund: %+v", d)
				}
			})
		}
	}
}
