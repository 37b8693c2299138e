package storetest

import (
	"errors"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/driplimit/drip"
	"github.com/driplimit/drip/bucket"
	"github.com/driplimit/drip/store"
)

// RunErrors checks that every kind of bad input is an error (errors.Is the
// documented sentinel) and changes nothing.
func RunErrors(t *testing.T, newStore NewStore) {
	st := newStore(t)
	c := ctx(t)
	p := prefix()
	at := base()
	good := drip.PerSecond(10)
	cases := []struct {
		name string
		r    drip.Request
		want error
	}{
		{"missing key", drip.Request{Limit: good, Cost: 1}, store.ErrMissingKey},
		{"negative cost", drip.Request{Key: p + "k", Limit: good, Cost: -1}, store.ErrInvalidCost},
		{"NaN cost", drip.Request{Key: p + "k", Limit: good, Cost: math.NaN()}, store.ErrInvalidCost},
		{"infinite cost", drip.Request{Key: p + "k", Limit: good, Cost: math.Inf(1)}, store.ErrInvalidCost},
		{"zero rate", drip.Request{Key: p + "k", Limit: drip.Limit{}, Cost: 1}, drip.ErrInvalidLimit},
		{"negative rate", drip.Request{Key: p + "k", Limit: drip.Limit{Rate: -1}, Cost: 1}, drip.ErrInvalidLimit},
		{"NaN rate", drip.Request{Key: p + "k", Limit: drip.Limit{Rate: math.NaN()}, Cost: 1}, drip.ErrInvalidLimit},
		{"negative period", drip.Request{Key: p + "k", Limit: drip.Limit{Rate: 1, Period: -time.Second}, Cost: 1}, drip.ErrInvalidLimit},
		{"negative burst", drip.Request{Key: p + "k", Limit: drip.Limit{Rate: 1, Burst: -1}, Cost: 1}, drip.ErrInvalidLimit},
		{"unknown algorithm", drip.Request{Key: p + "k", Limit: drip.Limit{Rate: 1, Algorithm: "leaky"}, Cost: 1}, drip.ErrInvalidLimit},
		{"unknown refill", drip.Request{Key: p + "k", Limit: drip.Limit{Rate: 1, Refill: "sometimes"}, Cost: 1}, drip.ErrInvalidLimit},
		{"cost over burst", drip.Request{Key: p + "k", Limit: good, Cost: 10.5}, drip.ErrCostExceedsBurst},
		{"key too long", drip.Request{Key: p + "k" + strings.Repeat("x", store.MaxKeyLen), Limit: good, Cost: 1}, store.ErrKeyTooLong},
	}
	for _, tc := range cases {
		for _, op := range []bucket.Op{bucket.Take, bucket.Peek} {
			if _, err := Apply(c, st, op, at, tc.r); !errors.Is(err, tc.want) {
				t.Errorf("%s (%v): err = %v, want %v", tc.name, op, err, tc.want)
			}
		}
		if _, err := drip.Apply(c, st, bucket.Take, at, []drip.Request{{Key: p + "ok", Limit: good, Cost: 1}, tc.r}...); !errors.Is(err, tc.want) {
			t.Errorf("%s in a multi-take: err = %v, want %v", tc.name, err, tc.want)
		}
	}
	if _, err := drip.Apply(c, st, bucket.Take, at, nil...); !errors.Is(err, store.ErrNoRequests) {
		t.Errorf("empty multi-take: err = %v, want %v", err, store.ErrNoRequests)
	}
	dup := []drip.Request{{Key: p + "d", Limit: good, Cost: 1}, {Key: p + "d", Limit: good, Cost: 1}}
	if _, err := drip.Apply(c, st, bucket.Take, at, dup...); !errors.Is(err, store.ErrDuplicateKey) {
		t.Errorf("duplicate keys: err = %v, want %v", err, store.ErrDuplicateKey)
	}
	if err := st.Reset(c, ""); !errors.Is(err, store.ErrMissingKey) {
		t.Errorf("reset of no key: err = %v, want %v", err, store.ErrMissingKey)
	}
	// A reservation that can never fit (cost above burst + max_reserved).
	bounded := drip.Limit{Rate: 4, Burst: 1, MaxReserved: 3}
	for _, op := range []bucket.Op{bucket.Take, bucket.Peek} {
		r := drip.Request{Key: p + "k", Limit: bounded, Cost: 5, Reserve: true}
		if _, err := Apply(c, st, op, at, r); !errors.Is(err, drip.ErrCostExceedsBurst) {
			t.Errorf("reservation that can never fit (%v): err = %v, want %v", op, err, drip.ErrCostExceedsBurst)
		}
		if _, err := drip.Apply(c, st, op, at, []drip.Request{{Key: p + "ok", Limit: good, Cost: 1}, r}...); !errors.Is(err, drip.ErrCostExceedsBurst) {
			t.Errorf("reservation that can never fit in a multi-take (%v): err = %v, want %v", op, err, drip.ErrCostExceedsBurst)
		}
	}
	// An op that is none of take, peek, refund.
	for _, op := range []bucket.Op{bucket.Refund + 1, 4, 255} {
		r := drip.Request{Key: p + "k", Limit: good, Cost: 1}
		if _, err := Apply(c, st, op, at, r); !errors.Is(err, store.ErrInvalidOp) {
			t.Errorf("op %v: err = %v, want %v", op, err, store.ErrInvalidOp)
		}
		if _, err := drip.Apply(c, st, op, at, []drip.Request{r, {Key: p + "ok", Limit: good, Cost: 1}}...); !errors.Is(err, store.ErrInvalidOp) {
			t.Errorf("op %v in a multi-take: err = %v, want %v", op, err, store.ErrInvalidOp)
		}
	}
	if err := st.Reset(c, p+"k"+strings.Repeat("x", store.MaxKeyLen)); !errors.Is(err, store.ErrKeyTooLong) {
		t.Errorf("reset of a key over MaxKeyLen: err = %v, want %v", err, store.ErrKeyTooLong)
	}
	// A key near MaxKeyLen (less 32 bytes, room for the prefix of a
	// wrapper such as store.Prefixed) is a key like any other.
	long := p + strings.Repeat("l", store.MaxKeyLen-32-len(p))
	for i, want := range []float64{9, 8} {
		if d, err := Apply(c, st, bucket.Take, at, drip.Request{Key: long, Limit: good, Cost: 1}); err != nil || d.Tokens != want {
			t.Errorf("take %d on a key near MaxKeyLen bytes: %+v, %v; want %v tokens", i, d, err, want)
		}
	}
	if err := st.Reset(c, long); err != nil {
		t.Errorf("reset of a key near MaxKeyLen bytes: %v", err)
	}
	if d, err := Apply(c, st, bucket.Peek, at, drip.Request{Key: long, Limit: good, Cost: 0}); err != nil || d.Tokens != 10 {
		t.Errorf("after its reset, the key near MaxKeyLen bytes holds %v (err %v), want 10", d.Tokens, err)
	}
	// Nothing above consumed anything.
	for _, k := range []string{"k", "ok", "d"} {
		d, err := Apply(c, st, bucket.Peek, at, drip.Request{Key: p + k, Limit: good, Cost: 0})
		if err != nil || d.Tokens != 10 {
			t.Errorf("after the errors, %s holds %v (err %v), want 10", k, d.Tokens, err)
		}
	}
}

// RunMulti checks all-or-nothing multi-takes.
func RunMulti(t *testing.T, newStore NewStore) {
	st := newStore(t)
	c := ctx(t)
	p := prefix()
	at := base()
	user := drip.PerSecond(10)
	tenant := drip.Limit{Rate: 5, Period: 10 * s, Burst: 20, Refill: drip.Interval}
	req := func(k string, l drip.Limit, cost float64) drip.Request {
		return drip.Request{Key: p + k, Limit: l, Cost: cost}
	}
	// All allowed: all applied.
	m, err := drip.Apply(c, st, bucket.Take, at, []drip.Request{req("u", user, 4), req("t", tenant, 15)}...)
	if err != nil {
		t.Fatal(err)
	}
	if !m.Allowed || len(m.Decisions) != 2 || m.Decisions[0].Tokens != 6 || m.Decisions[1].Tokens != 5 || m.RetryAfter != 0 {
		t.Fatalf("all allowed: %+v", m)
	}
	// One denied: none applied, each shows its own decision.
	m, err = drip.Apply(c, st, bucket.Take, at.Add(100*ms), []drip.Request{req("u", user, 2), req("t", tenant, 6), req("x", user, 1)}...)
	if err != nil {
		t.Fatal(err)
	}
	want := []drip.Decision{
		{Allowed: true, Tokens: 5, Remaining: 5, Burst: 10, ResetAfter: 500 * ms},
		{Allowed: false, Tokens: 5, Remaining: 5, Burst: 20, RetryAfter: 9900 * ms, ResetAfter: 29900 * ms},
		{Allowed: true, Tokens: 9, Remaining: 9, Burst: 10, ResetAfter: 100 * ms},
	}
	if m.Allowed || m.RetryAfter != 9900*ms || len(m.Decisions) != 3 {
		t.Fatalf("one denied: %+v", m)
	}
	for i := range want {
		if !sameDecision(m.Decisions[i], want[i]) {
			t.Errorf("one denied, result %d: got %+v want %+v", i, m.Decisions[i], want[i])
		}
	}
	// Nothing was consumed by the denied multi-take.
	for k, w := range map[string]float64{"u": 7, "t": 5, "x": 10} {
		l := user
		if k == "t" {
			l = tenant
		}
		d, err := Apply(c, st, bucket.Peek, at.Add(100*ms), drip.Request{Key: p + k, Limit: l})
		if err != nil || d.Tokens != w {
			t.Errorf("after the denied multi-take %s holds %v (err %v), want %v", k, d.Tokens, err, w)
		}
	}
	// The overall retry is the largest among the denied.
	m, err = drip.Apply(c, st, bucket.Take, at.Add(100*ms), []drip.Request{req("u", user, 9), req("t", tenant, 10)}...)
	if err != nil {
		t.Fatal(err)
	}
	if m.Allowed || m.RetryAfter != 9900*ms || m.Decisions[0].RetryAfter != 200*ms {
		t.Errorf("two denied: %+v", m)
	}
	// A multi-peek writes nothing even when all would pass.
	if _, err := drip.Apply(c, st, bucket.Peek, at.Add(100*ms), []drip.Request{req("u", user, 1), req("t", tenant, 1)}...); err != nil {
		t.Fatal(err)
	}
	d, _ := Apply(c, st, bucket.Peek, at.Add(100*ms), drip.Request{Key: p + "u", Limit: user})
	if d.Tokens != 7 {
		t.Errorf("after a multi-peek u holds %v, want 7", d.Tokens)
	}
}

// RunConcurrency checks that no interleaving grants more than the bound.
func RunConcurrency(t *testing.T, newStore NewStore) {
	st := newStore(t)
	c := ctx(t)
	const workers, each = 16, 12
	t.Run("one key, one instant: exactly the burst", func(t *testing.T) {
		p := prefix()
		at := base()
		lim := drip.PerMinute(10).WithBurst(50)
		var granted atomic.Int64
		run(t, workers, func(w int) error {
			for range each {
				d, err := Apply(c, st, bucket.Take, at, drip.Request{Key: p + "hot", Limit: lim, Cost: 1})
				if err != nil {
					return err
				}
				if d.Allowed {
					granted.Add(1)
				}
			}
			return nil
		})
		if g := granted.Load(); g != 50 {
			t.Errorf("granted %d of %d at one instant, want exactly the burst 50", g, workers*each)
		}
	})
	t.Run("many keys, one instant: each its burst", func(t *testing.T) {
		p := prefix()
		at := base()
		lim := drip.PerMinute(1).WithBurst(3)
		const keys = 8
		var granted [keys]atomic.Int64
		run(t, workers, func(w int) error {
			for i := range each {
				k := (w + i) % keys
				d, err := Apply(c, st, bucket.Take, at, drip.Request{Key: p + string(rune('a'+k)), Limit: lim, Cost: 1})
				if err != nil {
					return err
				}
				if d.Allowed {
					granted[k].Add(1)
				}
			}
			return nil
		})
		for k := range granted {
			if g := granted[k].Load(); g != 3 {
				t.Errorf("key %d granted %d, want 3", k, g)
			}
		}
	})
	t.Run("overlapping multi-takes stay all-or-nothing", func(t *testing.T) {
		p := prefix()
		at := base()
		lim := drip.PerMinute(1).WithBurst(10)
		keys := []string{"a", "b", "c"}
		var granted [3]atomic.Int64
		run(t, workers, func(w int) error {
			for i := range each {
				x, y := (w+i)%3, (w+i+1)%3
				m, err := drip.Apply(c, st, bucket.Take, at, []drip.Request{
					{Key: p + keys[x], Limit: lim, Cost: 1}, {Key: p + keys[y], Limit: lim, Cost: 1}}...)
				if err != nil {
					return err
				}
				if m.Allowed {
					granted[x].Add(1)
					granted[y].Add(1)
				}
			}
			return nil
		})
		for i, k := range keys {
			d, err := Apply(c, st, bucket.Peek, at, drip.Request{Key: p + k, Limit: lim, Cost: 0})
			if err != nil {
				t.Fatal(err)
			}
			if g := granted[i].Load(); g > 10 || float64(g) != 10-d.Tokens {
				t.Errorf("key %s: granted %d, bucket holds %v: want granted <= 10 and granted + held = 10", k, g, d.Tokens)
			}
		}
	})
	t.Run("store clock: grants within burst + rate*T", func(t *testing.T) {
		p := prefix()
		lim := drip.PerSecond(200).WithBurst(20)
		var granted, calls atomic.Int64
		start := time.Now()
		deadline := start.Add(300 * time.Millisecond)
		run(t, workers, func(w int) error {
			// At least 20 calls in all, however slowly a loaded machine
			// runs them: the first 20 find tokens, so the burst is
			// always granted.
			for calls.Load() < 20 || time.Now().Before(deadline) {
				calls.Add(1)
				d, err := Apply(c, st, bucket.Take, time.Time{}, drip.Request{Key: p + "clock", Limit: lim, Cost: 1})
				if err != nil {
					return err
				}
				if d.Allowed {
					granted.Add(1)
				}
			}
			return nil
		})
		elapsed := time.Since(start)
		// The store's clock may tick in microseconds; allow one more token.
		bound := 20 + 200*elapsed.Seconds() + 1
		if g := granted.Load(); float64(g) > bound {
			t.Errorf("granted %d in %v, more than burst + rate*T = %.1f", g, elapsed, bound)
		} else if g < 20 {
			t.Errorf("granted only %d in %v: the burst alone is 20", g, elapsed)
		}
	})
}

func run(t *testing.T, workers int, f func(w int) error) {
	t.Helper()
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := f(w); err != nil {
				errs <- err
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}
