package engine_test

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/driplimit/drip"
	"github.com/driplimit/drip/bucket"
	"github.com/driplimit/drip/engine"
	"github.com/driplimit/drip/internal/testkit/testserver"
	"github.com/driplimit/drip/internal/testkit/teststores"
	"github.com/driplimit/drip/rules"
	"github.com/driplimit/drip/store/memstore"
)

func TestMain(m *testing.M) { testserver.Main(m) }

// queueRules is one global token bucket of 10 a second, burst 2, whose
// requests may wait up to 300 ms in a queue of at most maxQueue.
func queueRules(t *testing.T, e *engine.Engine, extra string) *engine.Rules {
	t.Helper()
	set, err := rules.Parse([]byte(`{"rules": [{"name": "q", "limit_keys": ["global"], "max_wait": "300ms"`+extra+`,
	  "algorithm_config": {"rps": 10, "burst": 2}}]}`), "rules.json")
	if err != nil {
		t.Fatal(err)
	}
	return e.Compile(set)
}

// passed is the result of one request: whether it passed, and when its
// Decide returned, after the start.
type passed struct {
	allowed bool
	at      time.Duration
}

// decideAll decides n requests at once and returns their results, in
// the order they returned.
func decideAll(ctx context.Context, e *engine.Engine, rs *engine.Rules, n int) []passed {
	start := time.Now()
	var mu sync.Mutex
	var res []passed
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			out := e.Decide(ctx, rs, values{})
			mu.Lock()
			res = append(res, passed{out.Allowed, time.Since(start)})
			mu.Unlock()
		})
	}
	wg.Wait()
	return res
}

// inBubble runs f in a synctest bubble, with an engine on a memory
// store: its waits are virtual.
func inBubble(t *testing.T, f func(t *testing.T, e *engine.Engine)) {
	synctest.Test(t, func(t *testing.T) {
		ms := memstore.New(memstore.WithSweep(0))
		defer ms.Close()
		e := engine.New(ms, engine.WithLogger(slog.New(slog.DiscardHandler)))
		defer e.Close()
		f(t, e)
	})
}

// TestQueueRate: of 10 requests at once on a bucket of 2 refilling 10 a
// second, with max_wait 300 ms, the 2 the bucket holds pass at once, the
// 3 it refills within 300 ms pass as each token comes (100, 200 and 300
// ms: first in, first out), and the other 5 are denied at once; none
// passes beyond the limit.
func TestQueueRate(t *testing.T) {
	inBubble(t, func(t *testing.T, e *engine.Engine) {
		res := decideAll(t.Context(), e, queueRules(t, e, ""), 10)
		var got []time.Duration
		denied := 0
		for _, r := range res {
			if r.allowed {
				got = append(got, r.at)
			} else if denied++; r.at != 0 {
				t.Errorf("a denial came after %v, want at once", r.at)
			}
		}
		slices.Sort(got)
		want := []time.Duration{0, 0, 100 * time.Millisecond, 200 * time.Millisecond, 300 * time.Millisecond}
		if !slices.Equal(got, want) || denied != 5 {
			t.Errorf("passed at %v and %d denied, want passed at %v and 5 denied", got, denied, want)
		}
	})
}

// TestQueueBound: with max_queue 2, two requests wait and the rest are
// denied at once.
func TestQueueBound(t *testing.T) {
	inBubble(t, func(t *testing.T, e *engine.Engine) {
		res := decideAll(t.Context(), e, queueRules(t, e, `, "max_queue": 2`), 10)
		var got []time.Duration
		for _, r := range res {
			if r.allowed {
				got = append(got, r.at)
			} else if r.at != 0 {
				t.Errorf("a denial came after %v, want at once", r.at)
			}
		}
		slices.Sort(got)
		want := []time.Duration{0, 0, 100 * time.Millisecond, 200 * time.Millisecond}
		if !slices.Equal(got, want) {
			t.Errorf("passed at %v, want %v", got, want)
		}
	})
}

// TestQueueCancel: a waiter whose client goes away leaves at once and
// its reservation comes back: a request that would have found the queue's
// debt full (the limit's 300 ms of refill all reserved) takes it and
// passes within its max_wait.
func TestQueueCancel(t *testing.T) {
	inBubble(t, func(t *testing.T, e *engine.Engine) {
		rs := queueRules(t, e, "")
		ctx := t.Context()
		for range 2 {
			if out := e.Decide(ctx, rs, values{}); !out.Allowed {
				t.Fatal("the burst denied")
			}
		}
		start := time.Now()
		var wg sync.WaitGroup
		for range 2 { // due at 100 and 200 ms
			wg.Go(func() {
				if out := e.Decide(ctx, rs, values{}); !out.Allowed {
					t.Error("a waiter was denied")
				}
			})
		}
		synctest.Wait()
		gone, cancel := context.WithCancel(ctx)
		left := make(chan time.Duration)
		go func() { // due at 300 ms: the last the wait allows
			out := e.Decide(gone, rs, values{})
			if out.Allowed || out.Applied[0].Event != engine.Denied || out.Reason != engine.ReasonTokenBucket {
				t.Errorf("the waiter that went away: allowed %v, %s (%s); want denied by the token bucket", out.Allowed, out.Applied[0].Event, out.Reason)
			}
			left <- time.Since(start)
		}()
		synctest.Wait()
		if out := e.Decide(ctx, rs, values{}); out.Allowed {
			t.Fatal("a fourth waiter was allowed: the debt bound did not hold")
		}
		time.Sleep(50 * time.Millisecond)
		cancel()
		if at := <-left; at != 50*time.Millisecond {
			t.Errorf("the waiter that went away left after %v, want 50ms (at once)", at)
		}
		out := e.Decide(ctx, rs, values{})
		if !out.Allowed || time.Since(start) != 300*time.Millisecond {
			t.Errorf("the next request after the reservation came back: allowed %v after %v, want allowed at 300ms", out.Allowed, time.Since(start))
		}
		wg.Wait()
	})
}

// holdSlot compiles a concurrency rule of one slot whose requests wait
// up to maxWait, and takes its slot.
func holdSlot(t *testing.T, e *engine.Engine, maxWait string) (*engine.Rules, *engine.Outcome) {
	t.Helper()
	set, err := rules.Parse([]byte(`{"rules": [{"name": "slots", "limit_keys": ["global"], "algorithm": "concurrency",
	  "max_wait": "`+maxWait+`", "algorithm_config": {"max_in_flight": 1}}]}`), "rules.json")
	if err != nil {
		t.Fatal(err)
	}
	rs := e.Compile(set)
	a := e.Decide(t.Context(), rs, values{})
	if !a.Allowed {
		t.Fatalf("the first request: denied (%v)", a.Err)
	}
	return rs, a
}

// TestQueueInFlight: a request waiting for a concurrency rule's slot is
// woken by a release in this engine, at once (not at its next ask).
func TestQueueInFlight(t *testing.T) {
	inBubble(t, func(t *testing.T, e *engine.Engine) {
		rs, a := holdSlot(t, e, "1s")
		ctx := t.Context()
		start := time.Now()
		got := make(chan passed)
		go func() {
			out := e.Decide(ctx, rs, values{})
			got <- passed{out.Allowed, time.Since(start)}
			out.Release(ctx)
		}()
		time.Sleep(130 * time.Millisecond) // past one ask (PollInterval), short of the next
		if err := a.Release(ctx); err != nil {
			t.Fatal(err)
		}
		if r := <-got; !r.allowed || r.at != 130*time.Millisecond {
			t.Errorf("the waiter: allowed %v after %v, want allowed at 130ms (the release)", r.allowed, r.at)
		}
		// A slot that stays held: the waiter is denied when its wait ends.
		b := e.Decide(ctx, rs, values{})
		start = time.Now()
		if out := e.Decide(ctx, rs, values{}); out.Allowed || out.Reason != engine.ReasonConcurrency || time.Since(start) != time.Second {
			t.Errorf("a waiter for a slot held throughout: allowed %v (%s) after %v, want denied after 1s", out.Allowed, out.Reason, time.Since(start))
		}
		b.Release(ctx)
	})
}

// TestQueueStores: on every store, of 20 requests at once on a bucket of
// 2 refilling 10 a second, whose requests may wait 590 ms, exactly the 2
// the bucket holds and the 5 it refills within 500 ms pass, their
// reservations due 100 ms apart; the rest are denied. The engine's clock
// stands still, so the store refills nothing meanwhile (the wait is
// measured on the real clock: the last reservation must be asked within
// 90 ms, which even a loaded machine does).
func TestQueueStores(t *testing.T) {
	for _, st := range teststores.Shared() {
		t.Run(st.Name, func(t *testing.T) {
			now := time.Unix(1_800_000_000, 0)
			e := engine.New(st.Open(t), engine.WithClock(func() time.Time { return now }),
				engine.WithTimeout(teststores.Timeout), engine.WithLogger(slog.New(slog.DiscardHandler)))
			defer e.Close()
			set, err := rules.Parse([]byte(`{"rules": [{"name": "q", "limit_keys": ["global"], "max_wait": "590ms", "max_queue": 100,
			  "algorithm_config": {"rps": 10, "burst": 2}}]}`), "rules.json")
			if err != nil {
				t.Fatal(err)
			}
			rs := e.Compile(set)
			var mu sync.Mutex
			var due []time.Duration
			var wg sync.WaitGroup
			for range 20 {
				wg.Go(func() {
					out := e.Decide(t.Context(), rs, values{})
					if out.Err != nil {
						t.Error(out.Err)
					}
					if out.Allowed {
						mu.Lock()
						due = append(due, out.Applied[0].Decision.RetryAfter)
						mu.Unlock()
					}
				})
			}
			wg.Wait()
			slices.Sort(due)
			// The wait left is measured on the real clock from each
			// request's arrival, so a loaded store that is slow to answer
			// the first take leaves less of the 590 ms for a reservation
			// (seen on PostgreSQL on a busy machine: the last two did not
			// fit). What every store must hold: the reservations passed
			// are the burst and then one a refill apart, none twice and
			// none beyond the wait (the exact count, in virtual time, is
			// TestQueueRate's).
			ms := 100 * time.Millisecond
			want := []time.Duration{0, 0, ms, 2 * ms, 3 * ms, 4 * ms, 5 * ms}
			if len(due) < 3 || len(due) > len(want) || !slices.Equal(due, want[:len(due)]) {
				t.Errorf("the passed requests' reservations were due at %v, want a prefix of %v of at least 3", due, want)
			}
		})
	}
}

// queueWatch is an observer that reports each request that joins a
// queue.
type queueWatch struct {
	engine.NopObserver
	joined chan string
}

func (q *queueWatch) Queued(rule string, delta int) {
	if delta > 0 {
		q.joined <- rule
	}
}

func (q *queueWatch) Waited(string, time.Duration, bool) {}

// TestQueueInFlightStores: on every store, a request that finds a
// concurrency rule's one slot held waits, and gets the slot when it is
// released; a third request meanwhile waits behind it.
func TestQueueInFlightStores(t *testing.T) {
	for _, st := range teststores.Shared() {
		t.Run(st.Name, func(t *testing.T) {
			obs := &queueWatch{joined: make(chan string, 2)}
			e := engine.New(st.Open(t), engine.WithTimeout(teststores.Timeout), engine.WithObserver(obs),
				engine.WithLogger(slog.New(slog.DiscardHandler)))
			defer e.Close()
			rs, a := holdSlot(t, e, "30s")
			ctx := t.Context()
			got := make(chan *engine.Outcome, 2)
			for range 2 {
				go func() { got <- e.Decide(ctx, rs, values{}) }()
				<-obs.joined
			}
			if err := a.Release(ctx); err != nil {
				t.Fatal(err)
			}
			b := <-got
			if !b.Allowed {
				t.Fatalf("the first waiter after the release: denied (%v)", b.Err)
			}
			select {
			case c := <-got:
				t.Fatalf("the second waiter passed while the first held the slot: allowed %v", c.Allowed)
			case <-time.After(3 * engine.PollInterval):
			}
			if err := b.Release(ctx); err != nil {
				t.Fatal(err)
			}
			if c := <-got; !c.Allowed {
				t.Errorf("the second waiter after the second release: denied (%v)", c.Err)
			} else {
				c.Release(ctx)
			}
		})
	}
}

// TestQueueLIFO: the waiters for a slot take it first in, first out
// while the first has waited less than half of its max_wait (1 s);
// past that the line is overloaded and the last in goes first, so that
// what is served has not waited long, while the first runs out its wait.
func TestQueueLIFO(t *testing.T) {
	inBubble(t, func(t *testing.T, e *engine.Engine) {
		rs, a := holdSlot(t, e, "1s")
		ctx := t.Context()
		var mu sync.Mutex
		var order []string
		var wg sync.WaitGroup
		wait := func(name string) {
			wg.Go(func() {
				out := e.Decide(ctx, rs, values{})
				if !out.Allowed {
					t.Errorf("%s: denied", name)
					return
				}
				mu.Lock()
				order = append(order, name)
				mu.Unlock()
				time.Sleep(10 * time.Millisecond)
				out.Release(ctx)
			})
			synctest.Wait()
		}
		// Not overloaded: the first in line has waited 400 ms of 1 s.
		wait("w1")
		time.Sleep(200 * time.Millisecond)
		wait("w2")
		time.Sleep(200 * time.Millisecond)
		a.Release(ctx)
		wg.Wait()
		if want := []string{"w1", "w2"}; !slices.Equal(order, want) {
			t.Errorf("served %v, want %v (first in, first out)", order, want)
		}
		// Overloaded: the first in line has waited 600 ms of 1 s.
		order = nil
		a = e.Decide(ctx, rs, values{})
		wait("w1")
		time.Sleep(100 * time.Millisecond)
		wait("w2")
		time.Sleep(500 * time.Millisecond)
		wait("w3")
		a.Release(ctx)
		wg.Wait()
		if want := []string{"w3", "w2", "w1"}; !slices.Equal(order, want) {
			t.Errorf("served %v, want %v (last in, first out)", order, want)
		}
	})
}

// TestQueueWaitsUntil: the engine tells until when the requests in its
// queues may wait (a graceful shutdown lets them): the latest end of
// their waits, and zero once none waits.
func TestQueueWaitsUntil(t *testing.T) {
	inBubble(t, func(t *testing.T, e *engine.Engine) {
		rs, a := holdSlot(t, e, "1s")
		ctx := t.Context()
		if got := e.WaitsUntil(); !got.IsZero() {
			t.Errorf("with none waiting: %v, want zero", got)
		}
		start := time.Now()
		var wg sync.WaitGroup
		for range 2 {
			wg.Go(func() {
				if out := e.Decide(ctx, rs, values{}); out.Allowed {
					out.Release(ctx)
				}
			})
			synctest.Wait()
			time.Sleep(300 * time.Millisecond)
		}
		if got, want := e.WaitsUntil(), start.Add(1300*time.Millisecond); !got.Equal(want) {
			t.Errorf("with two waiting: %v after the start, want %v", got.Sub(start), want.Sub(start))
		}
		a.Release(ctx)
		wg.Wait()
		if got := e.WaitsUntil(); !got.IsZero() {
			t.Errorf("once they passed: %v, want zero", got)
		}
	})
}

// classRules is one global token bucket of 10 a second, burst 2, whose
// requests name their class in x-priority and may wait up to maxWait in
// a queue of at most maxQueue; the classes share all of the capacity.
func classRules(t *testing.T, e *engine.Engine, algo, maxWait string, maxQueue int) *engine.Rules {
	t.Helper()
	set, err := rules.Parse([]byte(fmt.Sprintf(`{"rules": [{"name": "q", "limit_keys": ["global"], %s
	  "priority_from": "header:x-priority", "reserve": 0, "max_wait": %q, "max_queue": %d}]}`, algo, maxWait, maxQueue)), "rules.json")
	if err != nil {
		t.Fatal(err)
	}
	return e.Compile(set)
}

const (
	rateAlgo  = `"algorithm_config": {"rps": 10, "burst": 2},`
	slotsAlgo = `"algorithm": "concurrency", "algorithm_config": {"max_in_flight": 1},`
)

// served decides a request of class in the background, once the
// requests started before it wait, and records when it passed (or -1:
// denied) under its name.
type served struct {
	mu    sync.Mutex
	wg    sync.WaitGroup
	start time.Time
	at    map[string]time.Duration
	order []string
}

func newServed() *served { return &served{start: time.Now(), at: map[string]time.Duration{}} }

func (s *served) decide(t *testing.T, e *engine.Engine, rs *engine.Rules, name, class string, hold time.Duration) {
	s.wg.Go(func() {
		out := e.Decide(t.Context(), rs, values{"header:x-priority": class})
		s.mu.Lock()
		if out.Allowed {
			s.at[name] = time.Since(s.start)
			s.order = append(s.order, name)
		} else {
			s.at[name] = -1
		}
		s.mu.Unlock()
		if out.Allowed {
			time.Sleep(hold)
			out.Release(t.Context())
		}
	})
	synctest.Wait()
}

// TestQueueClassRate: the reservations of a rate rule's waiters go to
// the highest class first: three batch requests wait for the tokens due
// at 100, 200 and 300 ms; a critical one that comes after them passes
// at 100 ms, and they at 200, 300 and 400 ms. No more pass than the
// limit refills.
func TestQueueClassRate(t *testing.T) {
	inBubble(t, func(t *testing.T, e *engine.Engine) {
		rs := classRules(t, e, rateAlgo, "1s", 10)
		s := newServed()
		for range 2 {
			s.decide(t, e, rs, "burst", "batch", 0)
		}
		for _, n := range []string{"b1", "b2", "b3"} {
			s.decide(t, e, rs, n, "batch", 0)
		}
		time.Sleep(10 * time.Millisecond)
		s.decide(t, e, rs, "c", "critical", 0)
		s.wg.Wait()
		ms := time.Millisecond
		want := map[string]time.Duration{"burst": 0, "c": 100 * ms, "b1": 200 * ms, "b2": 300 * ms, "b3": 400 * ms}
		for n, at := range want {
			if s.at[n] != at {
				t.Errorf("%s passed at %v, want %v (all: %v)", n, s.at[n], at, s.at)
			}
		}
	})
}

// TestQueueClassDrop: a full queue drops its lowest class for a higher
// one, which takes its place; a request of the lowest class finds it
// full and is denied at once. With max_wait 200 ms the bucket's debt
// holds two reservations: a critical request that finds both held by
// batch requests takes the last's (given back), so the debt and the
// requests passed stay within the limit.
func TestQueueClassDrop(t *testing.T) {
	for _, tc := range []struct {
		name, maxWait string
		maxQueue      int
	}{
		{"queue full", "1s", 2},
		{"debt full", "200ms", 10},
	} {
		t.Run(tc.name, func(t *testing.T) {
			inBubble(t, func(t *testing.T, e *engine.Engine) {
				rs := classRules(t, e, rateAlgo, tc.maxWait, tc.maxQueue)
				s := newServed()
				for range 2 {
					s.decide(t, e, rs, "burst", "batch", 0)
				}
				s.decide(t, e, rs, "b1", "batch", 0)
				s.decide(t, e, rs, "b2", "batch", 0)
				s.decide(t, e, rs, "b3", "batch", 0) // the queue or the debt is full: denied at once
				s.mu.Lock()
				if s.at["b3"] != -1 {
					t.Errorf("a batch request past a full queue: passed at %v, want denied", s.at["b3"])
				}
				s.mu.Unlock()
				s.decide(t, e, rs, "c", "critical", 0)
				s.mu.Lock()
				if s.at["b2"] != -1 {
					t.Errorf("the last batch waiter: passed at %v, want dropped for the critical one", s.at["b2"])
				}
				s.mu.Unlock()
				s.wg.Wait()
				ms := time.Millisecond
				if s.at["c"] != 100*ms || s.at["b1"] != 200*ms {
					t.Errorf("critical passed at %v and b1 at %v, want 100ms and 200ms", s.at["c"], s.at["b1"])
				}
				// The bucket holds what the limit allows: nothing more
				// passes before the next refill.
				if out := e.Decide(t.Context(), rs, values{"header:x-priority": "critical"}); out.Allowed && tc.maxWait == "200ms" && time.Since(s.start) < 300*ms {
					t.Errorf("a request passed at %v beyond the limit", time.Since(s.start))
				}
			})
		})
	}
}

// TestQueueClassInFlight: the waiters for a concurrency rule's slot get
// it by class: a critical request that comes after two batch ones takes
// the slot released first; a batch request that finds the queue full of
// its class is denied at once, and a critical one drops the last batch
// waiter.
func TestQueueClassInFlight(t *testing.T) {
	inBubble(t, func(t *testing.T, e *engine.Engine) {
		rs := classRules(t, e, slotsAlgo, "1s", 3)
		s := newServed()
		s.decide(t, e, rs, "holder", "batch", 100*time.Millisecond)
		s.decide(t, e, rs, "b1", "batch", 10*time.Millisecond)
		s.decide(t, e, rs, "b2", "batch", 10*time.Millisecond)
		s.decide(t, e, rs, "c1", "critical", 10*time.Millisecond)
		s.decide(t, e, rs, "b3", "batch", 10*time.Millisecond) // full of its class
		s.decide(t, e, rs, "c2", "critical", 10*time.Millisecond)
		s.wg.Wait()
		if want := []string{"holder", "c1", "c2", "b1"}; !slices.Equal(s.order, want) {
			t.Errorf("served %v, want %v", s.order, want)
		}
		if s.at["b3"] != -1 || s.at["b2"] != -1 {
			t.Errorf("b3 (past a full queue) at %v, b2 (dropped for c2) at %v: want both denied", s.at["b3"], s.at["b2"])
		}
	})
}

// TestQueueClassStores: on every store, a critical request that finds a
// rate rule's debt full of batch reservations takes the place of the
// last: it gives its reservation back to the store and the critical one
// reserves, so the bucket owes exactly two; requests that leave give
// theirs back and it owes nothing. The engine's clock stands still, so
// the store refills nothing meanwhile, and no proof of denial it keeps
// grows stale: its peeks count every take and give-back it made, even
// one that was out while a peek was.
func TestQueueClassStores(t *testing.T) {
	for _, st := range teststores.Shared() {
		t.Run(st.Name, func(t *testing.T) {
			now := time.Unix(1_800_000_000, 0)
			e := engine.New(st.Open(t), engine.WithClock(func() time.Time { return now }),
				engine.WithTimeout(teststores.Timeout), engine.WithLogger(slog.New(slog.DiscardHandler)))
			defer e.Close()
			// The engine's clock stands still, but a waiter sleeps on the real
			// clock until its reservation is due: due times of 25 s and 50 s
			// outlast any pause a loaded machine gives the test.
			rs := classRules(t, e, `"algorithm_config": {"rate": 1, "period": "25s", "burst": 1},`, "59s", 10)
			first := e.Decide(t.Context(), rs, values{"header:x-priority": "critical"})
			if !first.Allowed {
				t.Fatalf("the burst: denied (%v)", first.Err)
			}
			bucketKey, limit := first.Applied[0].Key, first.Applied[0].Limit
			owed := func() float64 {
				m, err := e.Apply(t.Context(), bucket.Peek, []drip.Request{{Key: bucketKey, Limit: limit}}, nil)
				if err != nil {
					t.Fatal(err)
				}
				return -m.Decisions[0].Tokens
			}
			waitOwed := func(want float64) {
				t.Helper()
				for deadline := time.Now().Add(20 * time.Second); owed() != want; time.Sleep(5 * time.Millisecond) {
					if time.Now().After(deadline) {
						t.Fatalf("the bucket owes %v, want %v", owed(), want)
					}
				}
			}
			type waiting struct {
				cancel func()
				out    chan *engine.Outcome
			}
			wait := func(class string) waiting {
				ctx, cancel := context.WithCancel(t.Context())
				w := waiting{cancel, make(chan *engine.Outcome, 1)}
				go func() { w.out <- e.Decide(ctx, rs, values{"header:x-priority": class}) }()
				return w
			}
			b1 := wait("batch")
			waitOwed(1)
			b2 := wait("batch")
			waitOwed(2) // the debt 59 s of refill allows: full
			c := wait("critical")
			select {
			case out := <-b2.out:
				if out.Allowed {
					t.Error("the last batch waiter passed; want it dropped for the critical one")
				}
			case <-time.After(20 * time.Second):
				t.Fatal("the last batch waiter was not dropped")
			}
			waitOwed(2)
			b1.cancel()
			c.cancel()
			if (<-b1.out).Allowed || (<-c.out).Allowed {
				t.Error("a waiter that went away passed")
			}
			waitOwed(0)
		})
	}
}

// TestQueueClassShare: a waiting request below critical waits for its
// class's share instead of being shed at once. With a reserve of 10%,
// batch keeps a fifth of the burst of 2 (0.4 tokens) for higher classes:
// the second batch request, which would leave the bucket empty, passes
// at 40 ms, when the refill has brought the kept share back; a critical
// one passes at once while a token is left.
func TestQueueClassShare(t *testing.T) {
	inBubble(t, func(t *testing.T, e *engine.Engine) {
		set, err := rules.Parse([]byte(`{"rules": [{"name": "q", "limit_keys": ["global"], "priority_from": "header:x-priority",
		  "reserve": "10%", "max_wait": "1s", "algorithm_config": {"rps": 10, "burst": 2}}]}`), "rules.json")
		if err != nil {
			t.Fatal(err)
		}
		rs := e.Compile(set)
		s := newServed()
		s.decide(t, e, rs, "b1", "batch", 0)
		s.decide(t, e, rs, "b2", "batch", 0)
		s.wg.Wait()
		if s.at["b1"] != 0 || s.at["b2"] != 40*time.Millisecond {
			t.Errorf("batch passed at %v and %v, want 0 and 40ms (its share refilled)", s.at["b1"], s.at["b2"])
		}
		time.Sleep(time.Second) // the bucket full again
		s = newServed()
		s.decide(t, e, rs, "c1", "critical", 0)
		s.decide(t, e, rs, "c2", "critical", 0)
		s.wg.Wait()
		if s.at["c1"] != 0 || s.at["c2"] != 0 {
			t.Errorf("critical passed at %v and %v, want both at once", s.at["c1"], s.at["c2"])
		}
	})
}

// TestQueueCheckDenies: a request that a count_status rule denies is
// answered at once, though another of its rules would let it wait: a
// count_status rule has no max_wait, and waiting cannot make it pass.
// Before, the request waited the other rule's whole max_wait in its
// queue (a client locked out of its logins filled that queue for every
// other client) and was then denied, the other rule's bucket told of
// with more tokens than its burst.
func TestQueueCheckDenies(t *testing.T) {
	inBubble(t, func(t *testing.T, e *engine.Engine) {
		set, err := rules.Parse([]byte(`{"rules": [
		  {"name": "logins", "limit_keys": ["global"], "count_status": [401],
		   "algorithm_config": {"rate": 1, "period": "1h", "burst": 1}},
		  {"name": "q", "limit_keys": ["global"], "max_wait": "10s", "max_queue": 1,
		   "algorithm_config": {"rate": 1, "period": "1s", "burst": 1}}]}`), "rules.json")
		if err != nil {
			t.Fatal(err)
		}
		rs := e.Compile(set)
		ctx := t.Context()
		out := e.Decide(ctx, rs, values{})
		if !out.Allowed {
			t.Fatal("the first request denied")
		}
		if err := out.Settle(ctx, engine.Response{Status: 401}); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		out = e.Decide(ctx, rs, values{})
		if out.Allowed || time.Since(start) != 0 {
			t.Errorf("a request logins denies: allowed %v after %v, want denied at once", out.Allowed, time.Since(start))
		}
		for _, a := range out.Applied {
			if a.Decision.Remaining > int64(a.Decision.Burst) {
				t.Errorf("%s told of %d remaining of a burst of %v", a.Rule.Name, a.Decision.Remaining, a.Decision.Burst)
			}
		}
	})
}
