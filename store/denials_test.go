package store_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/driplimit/drip/bucket"
	"github.com/driplimit/drip/store"
	"github.com/driplimit/drip/store/memstore"
)

// counted counts the calls that reach a store.
type counted struct {
	store.Store
	calls int
}

func (c *counted) Apply(ctx context.Context, op bucket.Op, at time.Time, items []bucket.Prepared, results []bucket.Result) error {
	c.calls++
	return c.Store.Apply(ctx, op, at, items, results)
}

// TestDenialsAgree: on random traces of one instance (takes, peeks and
// refunds of random costs on a few keys, at random steps of time) the
// answers through store.Denials are the store's own, byte for byte, for
// every kind of limit, and some of them were local denials. Within what
// docs/semantics.md states of a local denial: for a continuous refill,
// the waits within a nanosecond and the tokens within a micro-token (the
// remainder of the refill the store keeps, which its answer does not
// carry); for a sliding window, the tokens as of the store's answer,
// never more than it would say.
func TestDenialsAgree(t *testing.T) {
	limits := []bucket.Params{
		{Kind: bucket.Continuous, Rate: 3 * bucket.Micro, Period: int64(time.Second), Burst: 5 * bucket.Micro, MaxReserved: 2 * bucket.Micro},
		{Kind: bucket.Continuous, Rate: 7 * bucket.Micro, Period: int64(time.Second) / 3, Burst: 4 * bucket.Micro, MaxReserved: 0},
		{Kind: bucket.Interval, Rate: 2 * bucket.Micro, Period: int64(time.Second), Burst: 6 * bucket.Micro, MaxReserved: 3 * bucket.Micro},
		{Kind: bucket.Window, Rate: 5 * bucket.Micro, Period: int64(time.Second), Burst: 5 * bucket.Micro, MaxReserved: 0},
		{Kind: bucket.Sliding, Rate: 5 * bucket.Micro, Period: int64(time.Second), Burst: 5 * bucket.Micro, MaxReserved: 0, Parts: 4},
	}
	for li, p := range limits {
		t.Run(fmt.Sprint(li), func(t *testing.T) {
			ref, ms := memstore.New(memstore.WithSweep(0)), memstore.New(memstore.WithSweep(0))
			defer ref.Close()
			defer ms.Close()
			d := store.NewDenials(ms, store.DenialsOptions{Stale: time.Hour})
			rng := rand.New(rand.NewPCG(uint64(li), 7))
			at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
			ctx := context.Background()
			for i := range 20000 {
				at = at.Add(time.Duration(rng.Int64N(int64(30 * time.Millisecond))))
				op := bucket.Take
				switch rng.IntN(20) {
				case 0:
					op = bucket.Refund
				case 1:
					op = bucket.Peek
				}
				it := bucket.Prepared{Key: fmt.Sprint("k", rng.IntN(3)), Params: p, Cost: []int64{bucket.Micro, bucket.Micro, 2 * bucket.Micro, bucket.Micro / 2}[rng.IntN(4)]}
				it.Reserve = p.Kind != bucket.Sliding && rng.IntN(8) == 0
				want, got := make([]bucket.Result, 1), make([]bucket.Result, 1)
				if err := ref.Apply(ctx, op, at, []bucket.Prepared{it}, want); err != nil {
					t.Fatal(err)
				}
				if err := d.Apply(ctx, op, at, []bucket.Prepared{it}, got); err != nil {
					t.Fatal(err)
				}
				if !agree(p, got[0], want[0]) {
					t.Fatalf("step %d, %v %+v at %v: %+v, the store's %+v", i, op, it, at, got[0], want[0])
				}
			}
			if d.Denied() == 0 {
				t.Error("no local denial")
			}
		})
	}
}

func agree(p bucket.Params, got, want bucket.Result) bool {
	near := func(a, b int64, d int64) bool { return a-b <= d && b-a <= d }
	switch p.Kind {
	case bucket.Continuous:
		return got.Allowed == want.Allowed && near(got.Tokens, want.Tokens, 1) &&
			near(int64(got.RetryAfter), int64(want.RetryAfter), 1) && near(int64(got.ResetAfter), int64(want.ResetAfter), 1)
	case bucket.Sliding:
		return got.Allowed == want.Allowed && got.Tokens <= want.Tokens && got.RetryAfter == want.RetryAfter && got.ResetAfter == want.ResetAfter
	}
	return got == want
}

// TestDenialsSaturated: a key over its limit (a fixed window) is denied
// with no store call until the instant its denial proved, and asked
// again at it; a refund or a reset through the wrapper clears the proof.
func TestDenialsSaturated(t *testing.T) {
	ms := memstore.New(memstore.WithSweep(0))
	defer ms.Close()
	c := &counted{Store: ms}
	d := store.NewDenials(c, store.DenialsOptions{Stale: time.Hour})
	ctx := context.Background()
	p := bucket.Params{Kind: bucket.Window, Rate: bucket.Micro, Period: int64(time.Second), Burst: bucket.Micro}
	it := []bucket.Prepared{{Key: "hot", Params: p, Cost: bucket.Micro}}
	res := make([]bucket.Result, 1)
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	take := func(at time.Time) bucket.Result {
		t.Helper()
		if err := d.Apply(ctx, bucket.Take, at, it, res); err != nil {
			t.Fatal(err)
		}
		return res[0]
	}
	take(at)
	r := take(at)
	if r.Allowed || c.calls != 2 {
		t.Fatalf("%+v after %d calls", r, c.calls)
	}
	until := at.Add(r.RetryAfter)
	for step := at; step.Before(until); step = step.Add(r.RetryAfter / 7) {
		if r := take(step); r.Allowed || r.RetryAfter != until.Sub(step) {
			t.Fatalf("at %v: %+v", step.Sub(at), r)
		}
	}
	if r := take(until.Add(-1)); r.Allowed || c.calls != 2 {
		t.Fatalf("just before the proven instant: %+v, %d calls", r, c.calls)
	}
	if r := take(until); !r.Allowed || c.calls != 3 {
		t.Fatalf("at the proven instant: %+v, %d calls", r, c.calls)
	}
	take(until) // denied again, proven
	if err := d.Reset(ctx, "hot"); err != nil {
		t.Fatal(err)
	}
	if r := take(until); !r.Allowed || c.calls != 5 {
		t.Fatalf("after a reset: %+v, %d calls", r, c.calls)
	}
	take(until)
	if err := d.Apply(ctx, bucket.Refund, until, it, res); err != nil {
		t.Fatal(err)
	}
	if r := take(until); !r.Allowed {
		t.Fatalf("after a refund: %+v, %d calls", r, c.calls)
	}
}

// TestDenialsBounded: 100,000 keys denied through a wrapper of 1 MiB
// keep it within its bound, and the latest keys' proofs are kept.
func TestDenialsBounded(t *testing.T) {
	ms := memstore.New(memstore.WithSweep(0))
	defer ms.Close()
	const bound = 1 << 20
	d := store.NewDenials(ms, store.DenialsOptions{Bytes: bound, Stale: time.Hour})
	ctx := context.Background()
	p := bucket.Params{Kind: bucket.Window, Rate: bucket.Micro, Period: int64(time.Hour), Burst: bucket.Micro}
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	res := make([]bucket.Result, 1)
	for i := range 100_000 {
		it := []bucket.Prepared{{Key: fmt.Sprintf("client-%08d", i), Params: p, Cost: bucket.Micro}}
		for range 2 {
			if err := d.Apply(ctx, bucket.Take, at, it, res); err != nil {
				t.Fatal(err)
			}
		}
		if i%1000 == 0 && d.Bytes() > bound {
			t.Fatalf("%d keys: %d bytes", i, d.Bytes())
		}
	}
	if b := d.Bytes(); b > bound || b < bound/2 {
		t.Errorf("%d bytes after 100,000 keys, bound %d", b, bound)
	}
	before := d.Denied()
	it := []bucket.Prepared{{Key: fmt.Sprintf("client-%08d", 99_999), Params: p, Cost: bucket.Micro}}
	if err := d.Apply(ctx, bucket.Take, at, it, res); err != nil || res[0].Allowed || d.Denied() != before+1 {
		t.Errorf("the latest key: %+v %v, local denials %d -> %d", res[0], err, before, d.Denied())
	}
}

// TestDenialsRenew: a proof is trusted for Stale at most; from three
// quarters of it one call asks the store again, and its answer renews
// the proof.
func TestDenialsRenew(t *testing.T) {
	ms := memstore.New(memstore.WithSweep(0))
	defer ms.Close()
	c := &counted{Store: ms}
	d := store.NewDenials(c, store.DenialsOptions{Stale: 100 * time.Millisecond})
	ctx := context.Background()
	p := bucket.Params{Kind: bucket.Window, Rate: bucket.Micro, Period: int64(time.Hour), Burst: bucket.Micro}
	it := []bucket.Prepared{{Key: "hot", Params: p, Cost: bucket.Micro}}
	res := make([]bucket.Result, 1)
	t0 := time.Date(2026, 1, 2, 3, 0, 0, 0, time.UTC)
	calls := func(at time.Duration) int {
		t.Helper()
		if err := d.Apply(ctx, bucket.Take, t0.Add(at), it, res); err != nil {
			t.Fatal(err)
		}
		return c.calls
	}
	calls(0)
	for _, step := range []struct {
		at    time.Duration
		calls int
	}{{0, 2}, {74 * time.Millisecond, 2}, {75 * time.Millisecond, 3}, {76 * time.Millisecond, 3}, {149 * time.Millisecond, 3}, {150 * time.Millisecond, 4}} {
		if n := calls(step.at); n != step.calls || res[0].Allowed {
			t.Fatalf("at %v: %+v after %d store calls, want %d", step.at, res[0], n, step.calls)
		}
	}
}

// TestDenialsAnswerRenews: a caller that asks Answer before Apply (the
// engine) still renews a proof through Apply.
func TestDenialsAnswerRenews(t *testing.T) {
	ms := memstore.New(memstore.WithSweep(0))
	defer ms.Close()
	c := &counted{Store: ms}
	d := store.NewDenials(c, store.DenialsOptions{Stale: 100 * time.Millisecond})
	ctx := context.Background()
	p := bucket.Params{Kind: bucket.Window, Rate: bucket.Micro, Period: int64(time.Hour), Burst: bucket.Micro}
	it := []bucket.Prepared{{Key: "hot", Params: p, Cost: bucket.Micro}}
	res := make([]bucket.Result, 1)
	t0 := time.Date(2026, 1, 2, 3, 0, 0, 0, time.UTC)
	decide := func(at time.Duration) {
		t.Helper()
		if d.Answer(bucket.Take, t0.Add(at), it, res) {
			return
		}
		if err := d.Apply(ctx, bucket.Take, t0.Add(at), it, res); err != nil {
			t.Fatal(err)
		}
	}
	decide(0)
	decide(0)
	for _, at := range []time.Duration{80, 90, 160, 170, 240} {
		decide(at * time.Millisecond)
	}
	if c.calls != 5 || res[0].Allowed {
		t.Errorf("%d store calls (%+v), want 5: two, and a renewal at 80, 160 and 240 ms", c.calls, res[0])
	}
}

// held is a store whose calls, while hold is set, each wait for a value
// on release before they are made.
type held struct {
	store.Store
	calls   atomic.Int64
	hold    atomic.Bool
	release chan struct{}
}

func (h *held) Apply(ctx context.Context, op bucket.Op, at time.Time, items []bucket.Prepared, results []bucket.Result) error {
	h.calls.Add(1)
	if h.hold.Load() {
		<-h.release
	}
	return h.Store.Apply(ctx, op, at, items, results)
}

// TestDenialsQueue: on a hot key over a token bucket of 10 a second, the
// calls that arrive when its proof ends do not all ask the store: one
// goes (and takes the token that came back), one more goes after it
// (and is denied, proving the others denied), and the rest wait for
// them and are denied locally.
func TestDenialsQueue(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ms := memstore.New(memstore.WithSweep(0))
		defer ms.Close()
		h := &held{Store: ms, release: make(chan struct{})}
		d := store.NewDenials(h, store.DenialsOptions{})
		ctx := context.Background()
		p := bucket.Params{Kind: bucket.Continuous, Rate: 10 * bucket.Micro, Period: int64(time.Second), Burst: bucket.Micro}
		it := []bucket.Prepared{{Key: "hot", Params: p, Cost: bucket.Micro}}
		take := func() bucket.Result {
			res := make([]bucket.Result, 1)
			if err := d.Apply(ctx, bucket.Take, time.Time{}, it, res); err != nil {
				t.Error(err)
			}
			return res[0]
		}
		if r := take(); !r.Allowed {
			t.Fatalf("first take: %+v", r)
		}
		if r := take(); r.Allowed || h.calls.Load() != 2 {
			t.Fatalf("second take: %+v, %d store calls", r, h.calls.Load())
		}
		time.Sleep(100 * time.Millisecond) // the proof has ended: a token is back
		h.hold.Store(true)
		const callers = 16
		var allowed, denied atomic.Int64
		var wg sync.WaitGroup
		for range callers {
			wg.Go(func() {
				if take().Allowed {
					allowed.Add(1)
				} else {
					denied.Add(1)
				}
			})
		}
		for _, want := range []int64{3, 4} {
			synctest.Wait() // one call out, the others waiting for it
			if n := h.calls.Load(); n != want {
				t.Fatalf("%d store calls, want %d", n, want)
			}
			h.release <- struct{}{}
		}
		wg.Wait()
		if n := h.calls.Load(); n != 4 || allowed.Load() != 1 || denied.Load() != callers-1 || d.Denied() != callers-2 {
			t.Errorf("%d store calls, %d allowed, %d denied (%d locally), want 4 calls, 1 allowed, %d denied (%d locally)",
				n, allowed.Load(), denied.Load(), d.Denied(), callers-1, callers-2)
		}
	})
}

// granting grants every take, reporting an empty bucket (as a leased
// instance does while blocks come in as fast as its calls take them).
type granting struct{ store.Store }

func (granting) Apply(_ context.Context, _ bucket.Op, _ time.Time, _ []bucket.Prepared, results []bucket.Result) error {
	for i := range results {
		results[i] = bucket.Result{Allowed: true, ResetAfter: time.Second}
	}
	return nil
}

// TestDenialsQueueBounded: a call waits behind at most two calls of its
// key, and behind the second only when the first came back within a
// quarter of Stale; then, after grants that proved nothing, it asks the
// store itself rather than wait on, one grant at a time.
func TestDenialsQueueBounded(t *testing.T) {
	type step struct {
		after time.Duration // of the store's call, before it answers
		calls int64         // store calls made then
	}
	for _, tc := range []struct {
		name  string
		steps []step
	}{
		{"two grants", []step{{0, 2}, {0, 3}}},
		{"a slow grant", []step{{30 * time.Millisecond, 2}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				h := &held{Store: granting{}, release: make(chan struct{})}
				d := store.NewDenials(h, store.DenialsOptions{Stale: 100 * time.Millisecond})
				p := bucket.Params{Kind: bucket.Continuous, Rate: 10 * bucket.Micro, Period: int64(time.Second), Burst: bucket.Micro}
				it := []bucket.Prepared{{Key: "hot", Params: p, Cost: bucket.Micro}}
				take := func() {
					if err := d.Apply(context.Background(), bucket.Take, time.Time{}, it, make([]bucket.Result, 1)); err != nil {
						t.Error(err)
					}
				}
				take() // a grant that left the bucket short: the next calls queue
				h.hold.Store(true)
				const callers = 16
				var wg sync.WaitGroup
				for range callers {
					wg.Go(take)
				}
				for _, st := range tc.steps {
					synctest.Wait()
					if n := h.calls.Load(); n != st.calls {
						t.Fatalf("%d store calls, want %d: one out, the others waiting", n, st.calls)
					}
					time.Sleep(st.after)
					h.release <- struct{}{}
				}
				synctest.Wait()
				if n := h.calls.Load(); n != 1+callers {
					t.Errorf("%d store calls, want %d: every call asks", n, 1+callers)
				}
				h.hold.Store(false)
				close(h.release)
				wg.Wait()
			})
		})
	}
}
