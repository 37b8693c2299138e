package engine

import (
	"testing"
	"testing/synctest"
	"time"
	"unsafe"

	"github.com/driplimit/drip"
	"github.com/driplimit/drip/internal/seconds"
	"github.com/driplimit/drip/internal/sfv"
	"github.com/driplimit/drip/rules"
	"github.com/driplimit/drip/store/memstore"
)

func TestBreaker(t *testing.T) {
	b := newBreaker()
	t0 := time.Unix(1000, 0)
	for i := range 3 {
		ok, tk, _ := b.allow(t0)
		if !ok || tk.probe {
			t.Fatalf("closed call %d: %v %+v", i, ok, tk)
		}
		if ch := b.failure(t0, cfg(3, time.Second), tk); (ch == BreakerOpen) != (i == 2) {
			t.Fatalf("failure %d: %q", i, ch)
		}
	}
	if ok, _, _ := b.allow(t0.Add(999 * time.Millisecond)); ok {
		t.Fatal("open breaker let a call through during the cool-down")
	}
	ok, tk, ch := b.allow(t0.Add(time.Second))
	if !ok || !tk.probe || ch != BreakerHalfOpen {
		t.Fatalf("after the cool-down: %v %+v %q", ok, tk, ch)
	}
	if ok, _, _ := b.allow(t0.Add(time.Second)); ok {
		t.Fatal("a second call went through while the probe was in flight")
	}
	if ch := b.success(t0, tk); ch != BreakerClosed || b.State() != BreakerClosed {
		t.Fatalf("probe success: %q %s", ch, b.State())
	}
}

// cfg is a breaker that opens at n failures that are at least half the
// calls of a window, stalls after a second, and cools down for cool.
func cfg(n int, cool time.Duration) rules.Breaker {
	return rules.Breaker{Failures: n, FailureRatio: 0.5, Stall: time.Second, Cooldown: cool}
}

// TestBreakerRatio: slow or successful calls among the failures keep the
// breaker closed while they are more than half; a new window counts
// afresh; a stall opens it whatever the counts.
func TestBreakerRatio(t *testing.T) {
	t0 := time.Unix(1000, 0)
	c := cfg(3, time.Second)
	call := func(b *breaker, at time.Time, fail bool) string {
		_, tk, _ := b.allow(at)
		if fail {
			return b.failure(at, c, tk)
		}
		return b.success(at, tk)
	}
	b := newBreaker()
	for range 5 {
		call(b, t0, false) // successes or slow calls
	}
	for i := range 4 {
		if ch := call(b, t0, true); ch != "" {
			t.Fatalf("failure %d after 5 good calls opened the breaker: %q", i+1, ch)
		}
	}
	// The fifth failure: 5 of 10 calls, half.
	if ch := call(b, t0, true); ch != BreakerOpen {
		t.Fatalf("5 failures of 10 calls: %q", ch)
	}

	// Failures spread over windows never add up to the threshold.
	b = newBreaker()
	for i := range 10 {
		at := t0.Add(time.Duration(i) * BreakerWindow / 2)
		if i%2 == 0 {
			call(b, at, true)
			call(b, at, true)
		} else if ch := call(b, at, false); ch != "" {
			t.Fatal(ch)
		}
		if b.State() != BreakerClosed {
			t.Fatalf("opened at step %d with at most 2 failures a window", i)
		}
	}

	// A stall opens the breaker at once; a stale stall changes nothing.
	b = newBreaker()
	_, stale, _ := b.allow(t0)
	_, tk, _ := b.allow(t0)
	if ch := b.stalled(t0, c, tk); ch != BreakerOpen {
		t.Fatalf("stall: %q", ch)
	}
	if ch := b.stalled(t0, c, stale); ch != "" {
		t.Fatalf("stale stall: %q", ch)
	}
	// The probe after the cool-down stalls too: open again.
	_, probe, _ := b.allow(t0.Add(time.Second))
	if ch := b.stalled(t0.Add(2*time.Second), c, probe); ch != BreakerOpen || b.State() != BreakerOpen {
		t.Fatalf("stalled probe: %q %s", ch, b.State())
	}
}

// TestBreakerInterleavings holds the breaker to its doc when calls overlap
// its changes of state: only the probe closes it, a call that started
// before it opened counts for nothing after, and half-open lets exactly one
// probe through at a time. Time is injected; nothing sleeps.
func TestBreakerInterleavings(t *testing.T) {
	t0 := time.Unix(1000, 0)
	cool := 10 * time.Second
	// open returns a breaker opened at t0 by 3 failures, and the ticket of
	// a call that started while it was still closed and is still running.
	open := func() (*breaker, ticket) {
		b := newBreaker()
		_, slow, _ := b.allow(t0)
		for range 3 {
			_, tk, _ := b.allow(t0)
			b.failure(t0, cfg(3, cool), tk)
		}
		if b.State() != BreakerOpen {
			t.Fatalf("not open after 3 failures: %s", b.State())
		}
		return b, slow
	}

	t.Run("a success from before the opening does not close it", func(t *testing.T) {
		b, slow := open()
		if ch := b.success(t0, slow); ch != "" || b.State() != BreakerOpen {
			t.Fatalf("stale success while open: %q, %s", ch, b.State())
		}
		if ok, _, _ := b.allow(t0.Add(time.Second)); ok {
			t.Fatal("a call went through during the cool-down after a stale success")
		}
	})

	t.Run("a success from before the opening does not close it half-open", func(t *testing.T) {
		b, slow := open()
		ok, probe, _ := b.allow(t0.Add(cool))
		if !ok || !probe.probe {
			t.Fatal("no probe after the cool-down")
		}
		if ch := b.success(t0, slow); ch != "" || b.State() != BreakerHalfOpen {
			t.Fatalf("stale success while half-open: %q, %s", ch, b.State())
		}
		// Still exactly one probe: no second call gets through.
		if ok, _, _ := b.allow(t0.Add(cool)); ok {
			t.Fatal("a second probe went through after a stale success")
		}
		if ch := b.success(t0, probe); ch != BreakerClosed {
			t.Fatalf("the probe's success: %q, %s", ch, b.State())
		}
	})

	t.Run("a failure from before the opening does not reopen or count", func(t *testing.T) {
		b, slow := open()
		_, probe, _ := b.allow(t0.Add(cool))
		if ch := b.failure(t0.Add(cool), cfg(3, cool), slow); ch != "" || b.State() != BreakerHalfOpen {
			t.Fatalf("stale failure while half-open: %q, %s", ch, b.State())
		}
		b.success(t0, probe)
		// The stale failure did not count against the new closed state:
		// three fresh failures are needed to open it.
		for i := range 3 {
			_, tk, _ := b.allow(t0.Add(cool))
			if i < 2 && b.failure(t0.Add(cool), cfg(3, cool), slow) != "" {
				t.Fatal("a stale failure counted after closing")
			}
			if ch := b.failure(t0.Add(cool), cfg(3, cool), tk); (ch == BreakerOpen) != (i == 2) {
				t.Fatalf("failure %d after closing: %q", i, ch)
			}
		}
	})

	t.Run("only one probe per half-open state", func(t *testing.T) {
		b, _ := open()
		at := t0.Add(cool)
		ok, p1, _ := b.allow(at)
		if !ok || !p1.probe {
			t.Fatal("no first probe")
		}
		for range 5 {
			if ok, _, _ := b.allow(at); ok {
				t.Fatal("a second call went through while the probe was in flight")
			}
		}
		// The probe fails: open again for a whole cool-down.
		if ch := b.failure(at, cfg(3, cool), p1); ch != BreakerOpen {
			t.Fatalf("failed probe: %q", ch)
		}
		if ok, _, _ := b.allow(at.Add(cool - 1)); ok {
			t.Fatal("a call went through before the new cool-down ended")
		}
		ok, p2, _ := b.allow(at.Add(cool))
		if !ok || !p2.probe {
			t.Fatal("no probe after the second cool-down")
		}
		// The first probe's outcome, reported again or late, is stale.
		if ch := b.success(t0, p1); ch != "" || b.State() != BreakerHalfOpen {
			t.Fatalf("the earlier probe's success closed the breaker: %q %s", ch, b.State())
		}
		if ok, _, _ := b.allow(at.Add(cool)); ok {
			t.Fatal("a second probe went through")
		}
		if ch := b.success(t0, p2); ch != BreakerClosed {
			t.Fatalf("the current probe's success: %q", ch)
		}
	})

	t.Run("an abandoned probe passes the turn without counting", func(t *testing.T) {
		b, _ := open()
		at := t0.Add(cool)
		_, p1, _ := b.allow(at)
		b.abandon(p1)
		if b.State() != BreakerHalfOpen {
			t.Fatalf("abandoned probe: %s", b.State())
		}
		ok, p2, _ := b.allow(at)
		if !ok || !p2.probe {
			t.Fatal("no probe after the first was abandoned")
		}
		if ok, _, _ := b.allow(at); ok {
			t.Fatal("two probes at once")
		}
		if ch := b.success(t0, p2); ch != BreakerClosed {
			t.Fatalf("%q", ch)
		}
	})
}

func TestBeforeTake(t *testing.T) {
	// Continuous, 10/s burst 20: 5 left after taking 2 means 7 before,
	// full in 1.3 s rather than 1.5 s.
	d := drip.Decision{Allowed: true, Tokens: 5, Remaining: 5, Burst: 20, ResetAfter: 1500 * time.Millisecond}
	got := beforeTake(d, PlanOf("", drip.PerSecond(10).WithBurst(20)), "k", 2)
	if got.Tokens != 7 || got.Remaining != 7 || got.ResetAfter != 1300*time.Millisecond {
		t.Errorf("continuous: %+v", got)
	}
	// Interval, 5 per 10 s burst 20: 9 left after taking 2 (11 before);
	// full after 3 periods from 9, 2 from 11.
	got = beforeTake(drip.Decision{Allowed: true, Tokens: 9, Remaining: 9, ResetAfter: 27 * time.Second},
		PlanOf("", drip.Per(5, 10*time.Second).WithBurst(20).WithRefill(drip.Interval)), "k", 2)
	if got.Tokens != 11 || got.Remaining != 11 || got.ResetAfter != 17*time.Second {
		t.Errorf("interval: %+v", got)
	}
	// Cost 0 changes nothing.
	if got := beforeTake(d, PlanOf("", drip.PerSecond(10).WithBurst(20)), "k", 0); got != d {
		t.Errorf("cost 0: %+v", got)
	}
}

func TestFillSeconds(t *testing.T) {
	for _, c := range []struct {
		l    drip.Limit
		want int64
	}{
		{drip.PerSecond(10).WithBurst(20), 2},
		{drip.PerSecond(3).WithBurst(10), 4},
		{drip.Per(100, time.Minute), 60},
		{drip.Per(5, 10*time.Second).WithBurst(12).WithRefill(drip.Interval), 30},
		{drip.Per(3, 10*time.Second).Window(), 10},
		{drip.PerSecond(0.1).WithBurst(1), 10},
	} {
		if got := seconds.Ceil(PlanOf("", c.l).fill); got != c.want {
			t.Errorf("seconds.Ceil(PlanOf(%v).fill) = %d, want %d", c.l, got, c.want)
		}
	}
	// q is a whole number, the burst rounded down (never more than the
	// bucket holds); a concurrency limit is a quota of concurrent
	// requests without a window; a limit that never allows has no window.
	for _, c := range []struct {
		name string
		l    drip.Limit
		want string
	}{
		{"a", drip.PerSecond(2).WithBurst(2.5), `"a";q=2;w=2`},
		{"café", drip.PerSecond(3).WithBurst(1.23456), `"caf%c3%a9";q=1;w=1`},
		{"tiny", drip.PerSecond(1).WithBurst(0.5), `"tiny";q=0;w=1`},
		{"slots", drip.InFlight(3, 30*time.Second), `"slots";q=3;qu="concurrent-requests"`},
		{"shut", drip.Limit{}, `"shut";q=0`},
	} {
		got := PlanOf(c.name, c.l).policy
		if got != c.want {
			t.Errorf("policyItem(%q, %v) = %s, want %s", c.name, c.l, got, c.want)
		}
		if err := sfv.CheckHeaders(func(h string) string {
			if h == "RateLimit-Policy" {
				return got
			}
			return ""
		}); err != nil {
			t.Error(err)
		}
	}
}

// TestWatchStarved: a stall timer that fires late (its process did not
// get the CPU) does not judge the store stalled, since the answers may be
// waiting unread as the timer did; one that fires on time does.
func TestWatchStarved(t *testing.T) {
	e := New(memstore.New(memstore.WithSweep(0)))
	defer e.Close()
	w := &watch{e: e, br: cfg(5, time.Second), start: time.Now().Add(-time.Second).UnixNano(), stall: 500 * time.Millisecond}
	w.timer = time.AfterFunc(time.Hour, func() {})
	defer w.timer.Stop()
	w.due.Store(time.Now().Add(-200 * time.Millisecond).UnixNano()) // 200 ms late
	w.fire()
	if w.stalled.Load() || e.BreakerState() != BreakerClosed {
		t.Fatal("a late timer judged the store stalled")
	}
	w.due.Store(time.Now().UnixNano()) // on time, and nothing answered for a second
	w.fire()
	if !w.stalled.Load() || e.BreakerState() != BreakerOpen {
		t.Fatalf("a timer on time after a second without answers: stalled %v, breaker %s", w.stalled.Load(), e.BreakerState())
	}
}

// TestStallLate: a stall timer that runs late (the process was not
// running: a busy host, a GC pause) does not find the store stalled on
// that run, since answers that came meanwhile may not have been read yet
// (the runtime runs timers before it polls the network). It looks again,
// and opens the breaker only if the store has still answered nothing.
func TestStallLate(t *testing.T) {
	for _, answered := range []bool{true, false} {
		synctest.Test(t, func(t *testing.T) {
			ms := memstore.New(memstore.WithSweep(0))
			defer ms.Close()
			e := New(ms)
			defer e.Close()
			_, tk, _ := e.brk.allow(time.Now())
			// A call began 800 ms ago; its timer, due 300 ms ago (at
			// the 500 ms stall time), runs only now.
			now := time.Now()
			w := &watch{e: e, br: rules.DefaultBreaker, tk: tk, start: now.Add(-800 * time.Millisecond).UnixNano(), stall: 500 * time.Millisecond}
			w.timer = time.AfterFunc(time.Hour, w.fire)
			defer w.timer.Stop()
			w.due.Store(now.Add(-300 * time.Millisecond).UnixNano())
			w.fire()
			if w.stalled.Load() || e.BreakerState() != BreakerClosed {
				t.Fatalf("a late timer found the store stalled at once: breaker %s", e.BreakerState())
			}
			if answered {
				// The process reads the answers that waited: the call ends.
				time.Sleep(5 * time.Millisecond)
				e.answered.Store(time.Now().UnixNano())
				w.end()
				time.Sleep(2 * time.Second)
				if w.stalled.Load() || e.BreakerState() != BreakerClosed {
					t.Fatalf("the store answered, yet stalled: breaker %s", e.BreakerState())
				}
				return
			}
			time.Sleep(400 * time.Millisecond)
			if !w.stalled.Load() || e.BreakerState() != BreakerOpen {
				t.Fatalf("no answer on the second look, yet not stalled: breaker %s", e.BreakerState())
			}
		})
	}
}

// TestShareWindows: the local fallback's share of a sliding or calendar
// window is a valid window of that kind (its burst follows its rate),
// with at least one token.
func TestShareWindows(t *testing.T) {
	for _, l := range []drip.Limit{
		{Algorithm: drip.SlidingWindow, Rate: 10, Period: time.Minute},
		{Algorithm: drip.SlidingWindow, Rate: 1, Period: time.Minute, Burst: 1},
		{Algorithm: drip.FixedWindow, Rate: 1, Calendar: "day"},
	} {
		s := share(l, PlanOf("", l), 0.5)
		if err := s.Validate(); err != nil || s.Rate != max(l.Rate/2, 1) {
			t.Errorf("share(%v) = %v (%v), want a valid window of rate %v", l, s, err, max(l.Rate/2, 1))
		}
	}
}

// TestOutcomeFitsOneKiB: an Outcome with its two Applied (first) is one
// allocation of Go's 1,024-byte size class, which holds 1,016 bytes of
// an object with pointers (the rest is the allocator's header). At
// 1,032 bytes a decision allocated 128 bytes more and took 6% longer
// (BenchmarkDecide): keep new fields small, or beside others of their
// size.
func TestOutcomeFitsOneKiB(t *testing.T) {
	if n := unsafe.Sizeof(Outcome{}); n > 1016 {
		t.Errorf("an Outcome is %d bytes, over the 1,016 that fit the 1 KiB size class (Item %d, Applied %d)", n, unsafe.Sizeof(Item{}), unsafe.Sizeof(Applied{}))
	}
}
