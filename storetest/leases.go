package storetest

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/driplimit/drip"
	"github.com/driplimit/drip/bucket"
	"github.com/driplimit/drip/store"
)

// RunLeases checks concurrency limits (drip.Concurrency): acquiring up to
// MaxInFlight, denial and its RetryAfter, release, expiry after the lease
// TTL on injected times, peeks that write nothing, bad leases, multi-takes
// that mix leases and token buckets all or nothing, and 64 concurrent
// callers that never hold more than MaxInFlight slots.
func RunLeases(t *testing.T, newStore NewStore) {
	st := newStore(t)
	c := ctx(t)
	const ttl = 10 * time.Second
	lim := drip.InFlight(2, ttl)
	take := func(t *testing.T, op bucket.Op, at time.Time, key, lease string) drip.Decision {
		t.Helper()
		d, err := Apply(c, st, op, at, drip.Request{Key: key, Limit: lim, Cost: 1, Lease: lease})
		if err != nil {
			t.Fatalf("%v %s %q: %v", op, key, lease, err)
		}
		return d
	}
	want := func(t *testing.T, what string, d drip.Decision, allowed bool, remaining int64) {
		t.Helper()
		if d.Allowed != allowed || d.Remaining != remaining || d.Burst != 2 {
			t.Errorf("%s: allowed %v remaining %d burst %v, want allowed %v remaining %d burst 2", what, d.Allowed, d.Remaining, d.Burst, allowed, remaining)
		}
	}

	t.Run("acquire to the max, deny, release", func(t *testing.T) {
		k := prefix() + "c"
		at := base()
		want(t, "peek of a fresh key", take(t, bucket.Peek, at, k, ""), true, 2)
		want(t, "first", take(t, bucket.Take, at, k, "a"), true, 1)
		want(t, "second", take(t, bucket.Take, at.Add(time.Second), k, "b"), true, 0)
		d := take(t, bucket.Take, at.Add(2*time.Second), k, "c")
		want(t, "third", d, false, 0)
		if d.RetryAfter != ttl-2*time.Second {
			t.Errorf("third: retry after %v, want %v (when a's lease expires)", d.RetryAfter, ttl-2*time.Second)
		}
		want(t, "peek while full", take(t, bucket.Peek, at.Add(2*time.Second), k, ""), false, 0)
		want(t, "a again: it holds its slot", take(t, bucket.Take, at.Add(2*time.Second), k, "a"), true, 0)
		want(t, "release of b", take(t, bucket.Refund, at.Add(3*time.Second), k, "b"), true, 1)
		want(t, "release of b again: nothing", take(t, bucket.Refund, at.Add(3*time.Second), k, "b"), true, 1)
		want(t, "release of a lease never held", take(t, bucket.Refund, at.Add(3*time.Second), k, "zz"), true, 1)
		want(t, "peek with a lease writes nothing", take(t, bucket.Peek, at.Add(3*time.Second), k, "p"), true, 0)
		want(t, "c now", take(t, bucket.Take, at.Add(4*time.Second), k, "c"), true, 0)
		want(t, "d denied", take(t, bucket.Take, at.Add(4*time.Second), k, "d"), false, 0)
	})

	t.Run("a lease never released frees its slot after the TTL", func(t *testing.T) {
		k := prefix() + "ttl"
		at := base()
		take(t, bucket.Take, at, k, "dead1")
		take(t, bucket.Take, at.Add(time.Second), k, "dead2")
		want(t, "just before the TTL", take(t, bucket.Take, at.Add(ttl-time.Nanosecond), k, "x"), false, 0)
		want(t, "at the TTL one slot is back", take(t, bucket.Take, at.Add(ttl), k, "x"), true, 0)
		want(t, "the other one a second later", take(t, bucket.Take, at.Add(ttl+time.Second), k, "y"), true, 0)
		// Both holders are gone: their releases, late, change nothing.
		want(t, "a late release", take(t, bucket.Refund, at.Add(ttl+time.Second), k, "dead1"), true, 0)
		// Re-acquiring renews: x, taken at ttl, is renewed at ttl+5s and
		// still held at 2*ttl+1s.
		take(t, bucket.Take, at.Add(ttl+5*time.Second), k, "x")
		want(t, "renewed x still held, y expired", take(t, bucket.Take, at.Add(2*ttl+time.Second+time.Nanosecond), k, "z"), true, 0)
		want(t, "full again", take(t, bucket.Take, at.Add(2*ttl+time.Second+time.Nanosecond), k, "w"), false, 0)
	})

	t.Run("bad leases are errors and take nothing", func(t *testing.T) {
		k := prefix() + "bad"
		at := base()
		tb := drip.PerSecond(10)
		cases := []struct {
			name string
			op   bucket.Op
			r    drip.Request
			want error
		}{
			{"take without a lease", bucket.Take, drip.Request{Key: k, Limit: lim, Cost: 1}, store.ErrInvalidLease},
			{"release without a lease", bucket.Refund, drip.Request{Key: k, Limit: lim, Cost: 1}, store.ErrInvalidLease},
			{"a lease too long", bucket.Take, drip.Request{Key: k, Limit: lim, Lease: strings.Repeat("x", store.MaxLeaseLen+1)}, store.ErrInvalidLease},
			{"a lease with a space", bucket.Take, drip.Request{Key: k, Limit: lim, Lease: "a b"}, store.ErrInvalidLease},
			{"a lease on a token bucket", bucket.Take, drip.Request{Key: k + "tb", Limit: tb, Cost: 1, Lease: "a"}, store.ErrInvalidLease},
			{"reserve", bucket.Take, drip.Request{Key: k, Limit: lim, Lease: "a", Reserve: true}, store.ErrInvalidCost},
			{"no slots", bucket.Take, drip.Request{Key: k, Limit: drip.InFlight(0, ttl), Lease: "a"}, drip.ErrInvalidLimit},
			{"a negative TTL", bucket.Take, drip.Request{Key: k, Limit: drip.InFlight(1, -time.Second), Lease: "a"}, drip.ErrInvalidLimit},
			{"a rate", bucket.Take, drip.Request{Key: k, Limit: drip.Limit{Algorithm: drip.Concurrency, MaxInFlight: 1, Rate: 1}, Lease: "a"}, drip.ErrInvalidLimit},
		}
		for _, tc := range cases {
			if _, err := Apply(c, st, tc.op, at, tc.r); !errors.Is(err, tc.want) || !store.IsInput(err) {
				t.Errorf("%s: err = %v, want %v", tc.name, err, tc.want)
			}
			if _, err := drip.Apply(c, st, tc.op, at, []drip.Request{{Key: k + "other", Limit: tb, Cost: 1}, tc.r}...); !errors.Is(err, tc.want) {
				t.Errorf("%s in a multi-take: err = %v, want %v", tc.name, err, tc.want)
			}
		}
		want(t, "nothing was taken", take(t, bucket.Peek, at, k, ""), true, 2)
		d, err := Apply(c, st, bucket.Peek, at, drip.Request{Key: k + "other", Limit: tb, Cost: 0})
		if err != nil || d.Tokens != 10 {
			t.Errorf("the bucket of the failed multi-takes holds %v (%v), want 10", d.Tokens, err)
		}
	})

	t.Run("a multi-take with a token bucket is all or nothing", func(t *testing.T) {
		p := prefix()
		at := base()
		tb := drip.PerMinute(1).WithBurst(3)
		one := drip.InFlight(1, ttl)
		multi := func(lease string) drip.Multi {
			t.Helper()
			m, err := drip.Apply(c, st, bucket.Take, at, []drip.Request{
				{Key: p + "tb", Limit: tb, Cost: 1}, {Key: p + "in", Limit: one, Lease: lease}}...)
			if err != nil {
				t.Fatal(err)
			}
			return m
		}
		tokens := func() float64 {
			t.Helper()
			d, err := Apply(c, st, bucket.Peek, at, drip.Request{Key: p + "tb", Limit: tb, Cost: 0})
			if err != nil {
				t.Fatal(err)
			}
			return d.Tokens
		}
		if m := multi("a"); !m.Allowed || m.Decisions[1].Remaining != 0 || m.Decisions[0].Tokens != 2 {
			t.Fatalf("first multi-take: %+v, want allowed with 2 tokens and no free slot", m)
		}
		m := multi("b")
		if m.Allowed || !m.Decisions[0].Allowed || m.Decisions[1].Allowed || m.RetryAfter != ttl {
			t.Errorf("multi-take with every slot held: %+v, want denied by the slot, retry after %v", m, ttl)
		}
		if got := tokens(); got != 2 {
			t.Errorf("after a multi-take denied by its slot the bucket holds %v, want 2 (nothing taken)", got)
		}
		// Release a in a multi-refund, which gives the token back too.
		if m, err := drip.Apply(c, st, bucket.Refund, at, []drip.Request{
			{Key: p + "tb", Limit: tb, Cost: 1}, {Key: p + "in", Limit: one, Lease: "a"}}...); err != nil || !m.Allowed {
			t.Fatalf("multi-refund: %+v %v", m, err)
		}
		if got := tokens(); got != 3 {
			t.Errorf("after the multi-refund the bucket holds %v, want 3", got)
		}
		// Empty the bucket: then the bucket denies and no slot is taken.
		if _, err := Apply(c, st, bucket.Take, at, drip.Request{Key: p + "tb", Limit: tb, Cost: 3}); err != nil {
			t.Fatal(err)
		}
		if m := multi("c"); m.Allowed || m.Decisions[0].Allowed || !m.Decisions[1].Allowed {
			t.Errorf("multi-take on an empty bucket: %+v, want denied by the bucket", m)
		}
		d, err := Apply(c, st, bucket.Peek, at, drip.Request{Key: p + "in", Limit: one})
		if err != nil || !d.Allowed || d.Remaining != 1 {
			t.Errorf("after a multi-take denied by its bucket: %+v %v, want the slot free", d, err)
		}
	})

	t.Run("an acquire at the store's clock answers the same on every store", func(t *testing.T) {
		// A store's own clock counts whole microseconds (Redis TIME,
		// PostgreSQL's clock_timestamp, the memory store's clock), and a
		// lease expires on the microsecond: a fresh acquire's reset_after
		// is its TTL exactly, whatever the instant.
		k := prefix() + "clock"
		const ttl = 30 * time.Second
		l := drip.InFlight(2, ttl)
		for i, w := range []drip.Decision{
			{Allowed: true, Tokens: 1, Remaining: 1, Burst: 2, ResetAfter: ttl},
			{Allowed: true, Tokens: 0, Remaining: 0, Burst: 2, ResetAfter: ttl},
		} {
			d, err := Apply(c, st, bucket.Take, time.Time{}, drip.Request{Key: k, Limit: l, Lease: fmt.Sprint("L", i)})
			if err != nil {
				t.Fatal(err)
			}
			// The second acquire comes later: reset_after is its lease's.
			if d != w {
				t.Errorf("acquire %d at the store's clock: %+v, want %+v", i+1, d, w)
			}
		}
	})

	t.Run("random steps agree with bucket.EvalLeases", func(t *testing.T) {
		for seed := range uint64(3) {
			compareLeases(t, st, seed, 200)
		}
	})

	t.Run("random steps with the clock stepping back and two TTLs", func(t *testing.T) {
		for seed := range uint64(2) {
			compareLeasesBack(t, st, seed, 300)
		}
	})

	t.Run("64 concurrent callers never hold more than the max", func(t *testing.T) {
		k := prefix() + "hot"
		const maxIn, workers, each = 5, 64, 6
		hot := drip.InFlight(maxIn, time.Hour)
		at := base()
		var holders, peak, granted atomic.Int64
		run(t, workers, func(w int) error {
			for range each {
				id := store.NewLeaseID()
				d, err := Apply(c, st, bucket.Take, at, drip.Request{Key: k, Limit: hot, Lease: id})
				if err != nil {
					return err
				}
				if !d.Allowed {
					continue
				}
				granted.Add(1)
				n := holders.Add(1)
				for {
					p := peak.Load()
					if n <= p || peak.CompareAndSwap(p, n) {
						break
					}
				}
				holders.Add(-1)
				if _, err := Apply(c, st, bucket.Refund, at, drip.Request{Key: k, Limit: hot, Lease: id}); err != nil {
					return err
				}
			}
			return nil
		})
		if p := peak.Load(); p > maxIn {
			t.Errorf("%d holders at once, more than max_in_flight %d", p, maxIn)
		}
		if g := granted.Load(); g < maxIn {
			t.Errorf("only %d acquisitions granted of %d tries: the first %d find free slots", g, workers*each, maxIn)
		}
		d, err := Apply(c, st, bucket.Peek, at, drip.Request{Key: k, Limit: hot})
		if err != nil || d.Remaining != maxIn {
			t.Errorf("after every holder released: %+v %v, want %d free slots", d, err, maxIn)
		}
	})
}

// compareLeases makes n random decisions on one concurrency key (takes,
// releases and peeks of a few leases, at times that step by up to 4 s,
// to the nanosecond, past the 10 s TTL now and then; every fifth step a
// multi-take with a token bucket) and checks each against the Go math
// run on a list of the leases: every field of every decision.
func compareLeases(t *testing.T, st store.Store, seed uint64, n int) {
	t.Helper()
	c := ctx(t)
	rng := rand.New(rand.NewPCG(seed, 7))
	key := prefix() + "rand"
	lim := drip.InFlight(3, 10*time.Second)
	tb := drip.PerSecond(1).WithBurst(2)
	p, err := lim.Params(key)
	if err != nil {
		t.Fatal(err)
	}
	var model []bucket.Holder
	at := base()
	ops := []bucket.Op{bucket.Take, bucket.Take, bucket.Refund, bucket.Peek}
	for i := range n {
		at = at.Add(time.Duration(rng.Int64N(int64(4 * time.Second))))
		op := ops[rng.IntN(len(ops))]
		id := fmt.Sprint("l", rng.IntN(6))
		if op == bucket.Peek && rng.IntN(2) == 0 {
			id = ""
		}
		now := at.UnixNano()
		want, write := p.EvalLeases(op, bucket.Leases(model, id, now), id, now)
		var got drip.Decision
		if i%5 == 4 && op == bucket.Take {
			// With a bucket that is at times empty: then nothing is taken.
			m, err := drip.Apply(c, st, op, at, []drip.Request{{Key: key + ":tb", Limit: tb, Cost: 1}, {Key: key, Limit: lim, Lease: id}}...)
			if err != nil {
				t.Fatalf("seed %d step %d: %v", seed, i, err)
			}
			got = m.Decisions[1]
			write = write && m.Allowed
			if m.Decisions[1].Allowed && !m.Allowed && m.Decisions[0].Allowed {
				t.Fatalf("seed %d step %d: %+v: denied with both allowed", seed, i, m)
			}
		} else {
			got, err = Apply(c, st, op, at, drip.Request{Key: key, Limit: lim, Lease: id})
			if err != nil {
				t.Fatalf("seed %d step %d: %v", seed, i, err)
			}
		}
		if w := drip.DecisionOf(want, p.Burst); got != w {
			t.Fatalf("seed %d step %d: %v %q at +%v: got %+v, want %+v (leases %+v)", seed, i, op, id, at.Sub(base()), got, w, model)
		}
		if write {
			model = p.NextLeases(op, model, id, now)
		}
	}
}

// compareLeasesBack is compareLeases with more leases (up to 20 of 12
// slots), a limit whose TTL changes from step to step (10 s or 3 s), times
// that now and then step back (a caller-supplied clock) or land exactly
// on a lease's expiry, and no multi-takes: a store must drop expired
// leases only when it writes, as bucket.NextLeases does, so that a lease
// that expired at a later time is live again at an earlier one.
func compareLeasesBack(t *testing.T, st store.Store, seed uint64, n int) {
	t.Helper()
	c := ctx(t)
	rng := rand.New(rand.NewPCG(seed, 11))
	key := prefix() + "back"
	lims := []drip.Limit{drip.InFlight(12, 10*time.Second), drip.InFlight(12, 3*time.Second)}
	var ps []bucket.Params
	for _, l := range lims {
		p, err := l.Params(key)
		if err != nil {
			t.Fatal(err)
		}
		ps = append(ps, p)
	}
	var model []bucket.Holder
	at := base()
	ops := []bucket.Op{bucket.Take, bucket.Take, bucket.Take, bucket.Refund, bucket.Peek}
	for i := range n {
		switch d := rng.IntN(100); {
		case d < 8:
			at = at.Add(-time.Duration(rng.Int64N(int64(4 * time.Second))))
		case d < 18 && len(model) > 0:
			at = time.Unix(0, model[rng.IntN(len(model))].Exp)
		default:
			at = at.Add(time.Duration(rng.Int64N(int64(time.Second))))
		}
		k := rng.IntN(len(lims))
		op := ops[rng.IntN(len(ops))]
		id := fmt.Sprint("l", rng.IntN(20))
		if op == bucket.Peek && rng.IntN(2) == 0 {
			id = ""
		}
		now := at.UnixNano()
		want, write := ps[k].EvalLeases(op, bucket.Leases(model, id, now), id, now)
		got, err := Apply(c, st, op, at, drip.Request{Key: key, Limit: lims[k], Lease: id})
		if err != nil {
			t.Fatalf("seed %d step %d: %v", seed, i, err)
		}
		if w := drip.DecisionOf(want, ps[k].Burst); got != w {
			t.Fatalf("seed %d step %d: %v %q at +%v: got %+v, want %+v (leases %+v)", seed, i, op, id, at.Sub(base()), got, w, model)
		}
		if write {
			model = ps[k].NextLeases(op, model, id, now)
		}
	}
}

// BenchLeases measures acquire+release pairs on one key of st: 64
// goroutines, each acquiring a fresh lease and releasing it, at the
// store's clock, beside holders leases acquired before the timing (held
// for an hour, so that every acquire of the benchmark is allowed). It
// reports pairs/s (wall time) and fails on any error or denial. A store
// whose acquire costs time linear in the leases held shows it as holders
// grows.
func BenchLeases(b *testing.B, st store.Store, holders int) {
	c := context.Background()
	key := prefix() + "bench"
	lim := drip.InFlight(holders+64, time.Hour)
	var next atomic.Int64
	fill := make(chan error, 16)
	for range 16 {
		go func() {
			for {
				i := next.Add(1)
				if i > int64(holders) {
					fill <- nil
					return
				}
				d, err := Apply(c, st, bucket.Take, time.Time{}, drip.Request{Key: key, Limit: lim, Lease: fmt.Sprint("h", i)})
				if err == nil && !d.Allowed {
					err = fmt.Errorf("prefill acquire %d denied", i)
				}
				if err != nil {
					fill <- err
					return
				}
			}
		}()
	}
	for range 16 {
		if err := <-fill; err != nil {
			b.Fatal(err)
		}
	}
	b.SetParallelism(max(1, 64/runtime.GOMAXPROCS(0)))
	b.ResetTimer()
	start := time.Now()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			id := store.NewLeaseID()
			d, err := Apply(c, st, bucket.Take, time.Time{}, drip.Request{Key: key, Limit: lim, Lease: id})
			if err == nil && !d.Allowed {
				err = fmt.Errorf("acquire denied: %+v", d)
			}
			if err == nil {
				_, err = Apply(c, st, bucket.Refund, time.Time{}, drip.Request{Key: key, Limit: lim, Lease: id})
			}
			if err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "pairs/s")
}
