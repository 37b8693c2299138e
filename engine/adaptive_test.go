package engine_test

import (
	"context"
	"log/slog"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/driplimit/drip/engine"
	"github.com/driplimit/drip/rules"
	"github.com/driplimit/drip/store/memstore"
)

// simUpstream is a stand-in upstream of capacity c: a request served
// with n in flight (itself included) takes base, or base*n/c past c
// (processor sharing); when failing it answers at once, dropped.
type simUpstream struct {
	mu      sync.Mutex
	n       int
	c       int
	base    time.Duration
	jitter  float64 // the latency is base times 1 ± jitter, at random
	failing bool
	rng     *rand.Rand
}

func (u *simUpstream) set(f func(u *simUpstream)) {
	u.mu.Lock()
	defer u.mu.Unlock()
	f(u)
}

func (u *simUpstream) serve() (dropped bool) {
	u.mu.Lock()
	if u.failing {
		u.mu.Unlock()
		time.Sleep(time.Millisecond)
		return true
	}
	u.n++
	lat := u.base
	if u.n > u.c {
		lat = u.base * time.Duration(u.n) / time.Duration(u.c)
	}
	if u.jitter > 0 {
		lat = time.Duration(float64(lat) * (1 + u.jitter*(2*u.rng.Float64()-1)))
	}
	u.mu.Unlock()
	time.Sleep(lat)
	u.mu.Lock()
	u.n--
	u.mu.Unlock()
	return false
}

// simRun drives clients closed-loop requests each (a denied one comes
// back after 10 ms) through the engine to u until ctx ends, counting
// what passed and what was denied by class; limit samples the learned
// limit every 100 ms.
type simRun struct {
	served, denied [101]atomic.Int64
	mu             sync.Mutex
	limits         []float64 // every 100 ms
}

func (s *simRun) limitsFrom(from, to time.Duration) []float64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]float64(nil), s.limits[from/(100*time.Millisecond):min(len(s.limits), int(to/(100*time.Millisecond)))]...)
}

func simulate(ctx context.Context, e *engine.Engine, rs *engine.Rules, u *simUpstream, clients func(i int) values, n int) *simRun {
	s := &simRun{}
	go func() {
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
				var l float64
				for _, st := range e.Adaptive() {
					l += st.Limit
				}
				s.mu.Lock()
				s.limits = append(s.limits, l)
				s.mu.Unlock()
			}
		}
	}()
	for i := range n {
		v := clients(i)
		class, _ := rules.ParsePriority(v["header:x-priority"])
		go func() {
			for ctx.Err() == nil {
				out := e.Decide(ctx, rs, v)
				if !out.Allowed {
					s.denied[class].Add(1)
					time.Sleep(10 * time.Millisecond)
					continue
				}
				if u.serve() {
					out.Drop()
				}
				_ = out.Release(ctx)
				s.served[class].Add(1)
			}
		}()
	}
	return s
}

func adaptiveEngine(t *testing.T, file string) (*engine.Engine, *engine.Rules) {
	set, err := rules.Parse([]byte(file), "rules.json")
	if err != nil {
		t.Fatal(err)
	}
	e := engine.New(memstore.New(memstore.WithSweep(0)), engine.WithLogger(slog.New(slog.DiscardHandler)))
	t.Cleanup(func() { e.Close() })
	return e, e.Compile(set)
}

const adaptiveSet = `{"rules": [{"name": "upstream", "limit_keys": ["global"], "algorithm": "adaptive"}]}`

func mean(xs []float64) float64 {
	var s float64
	for _, x := range xs {
		s += x
	}
	return s / float64(len(xs))
}

// simWithoutRace says why the long simulations of adaptive rules
// (TestAdaptiveConverges, TestAdaptiveRecovers, all but one load of
// TestAdaptiveOverloadGoals) skip under the race detector: they are
// minutes of virtual time, 17 s of CPU with it against 3.6 s without,
// and make test runs them without it first (as it does the allocation
// counts). Their harnesses still run under it: simulate in
// TestAdaptiveSteady, ovRunLoad in TestAdaptiveOverloadGoals' 2x load.
const simWithoutRace = "a simulation of seconds of CPU under the race detector: make test runs it without"

// TestAdaptiveConverges: an upstream of capacity 50 whose latency grows
// past it, offered twice that: the learned limit settles near 50
// (not the 1000 it may reach), and tracks a step of the capacity to 25
// and back to 50 within seconds, with no tuning.
func TestAdaptiveConverges(t *testing.T) {
	if engine.RaceEnabled {
		t.Skip(simWithoutRace)
	}
	synctest.Test(t, func(t *testing.T) {
		e, rs := adaptiveEngine(t, adaptiveSet)
		u := &simUpstream{c: 50, base: 20 * time.Millisecond}
		ctx, cancel := context.WithCancel(context.Background())
		s := simulate(ctx, e, rs, u, func(int) values { return values{} }, 100)
		time.Sleep(10 * time.Second)
		u.set(func(u *simUpstream) { u.c = 25 })
		time.Sleep(10 * time.Second)
		u.set(func(u *simUpstream) { u.c = 50 })
		time.Sleep(10 * time.Second)
		cancel()
		time.Sleep(time.Second)
		for _, p := range []struct {
			name     string
			from, to time.Duration
			lo, hi   float64
		}{
			{"capacity 50", 4 * time.Second, 10 * time.Second, 40, 80},
			{"capacity 25, after 3 s", 13 * time.Second, 20 * time.Second, 20, 40},
			{"capacity 50 again, after 3 s", 23 * time.Second, 30 * time.Second, 40, 80},
		} {
			ls := s.limitsFrom(p.from, p.to)
			m := mean(ls)
			if m < p.lo || m > p.hi {
				t.Errorf("%s: mean limit %.1f, want %v to %v (limits %v)", p.name, m, p.lo, p.hi, ls)
			}
			t.Logf("%s: mean limit %.1f", p.name, m)
		}
	})
}

// TestAdaptiveSteady: a healthy upstream (latency 20 ms ± 30%, far
// from its capacity) under a steady load for two minutes: after the
// first seconds no request is denied and the limit never falls below
// what the load holds in flight (it never sheds to re-measure).
func TestAdaptiveSteady(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e, rs := adaptiveEngine(t, adaptiveSet)
		u := &simUpstream{c: 10000, base: 20 * time.Millisecond, jitter: 0.3, rng: rand.New(rand.NewPCG(1, 2))}
		ctx, cancel := context.WithCancel(context.Background())
		s := simulate(ctx, e, rs, u, func(int) values { return values{} }, 10)
		time.Sleep(5 * time.Second)
		denied := s.denied[rules.PriorityDefault].Load()
		time.Sleep(2 * time.Minute)
		cancel()
		time.Sleep(time.Second)
		if d := s.denied[rules.PriorityDefault].Load() - denied; d != 0 {
			t.Errorf("%d requests denied on a healthy upstream after warming up (%d served)", d, s.served[rules.PriorityDefault].Load())
		}
		for i, l := range s.limitsFrom(5*time.Second, 125*time.Second) {
			if l < 10 {
				t.Fatalf("at %v the limit fell to %.1f, below the 10 requests in flight", 5*time.Second+time.Duration(i)*100*time.Millisecond, l)
			}
		}
	})
}

// TestAdaptiveRecovers: an upstream that fails (answers 503 at once)
// shrinks the limit; when it recovers the limit is back near its
// capacity within seconds.
func TestAdaptiveRecovers(t *testing.T) {
	if engine.RaceEnabled {
		t.Skip(simWithoutRace)
	}
	synctest.Test(t, func(t *testing.T) {
		e, rs := adaptiveEngine(t, adaptiveSet)
		u := &simUpstream{c: 50, base: 20 * time.Millisecond}
		ctx, cancel := context.WithCancel(context.Background())
		s := simulate(ctx, e, rs, u, func(int) values { return values{} }, 100)
		time.Sleep(10 * time.Second)
		u.set(func(u *simUpstream) { u.failing = true })
		time.Sleep(5 * time.Second)
		u.set(func(u *simUpstream) { u.failing = false })
		time.Sleep(10 * time.Second)
		cancel()
		time.Sleep(time.Second)
		before := mean(s.limitsFrom(5*time.Second, 10*time.Second))
		failing := s.limitsFrom(14*time.Second, 15*time.Second)
		if m := mean(failing); m > 5 {
			t.Errorf("an upstream that fails: the limit stayed at %.1f (before: %.1f)", m, before)
		}
		after := s.limitsFrom(18*time.Second, 25*time.Second)
		if m := mean(after); m < 0.8*before {
			t.Errorf("3 s after the upstream recovered: mean limit %.1f, want near %.1f (%v)", m, before, after)
		}
	})
}

// TestPriorityShedsLowestFirst: a token bucket and a concurrency rule
// with a reserve of 20%: batch requests may use 60% of the capacity,
// default ones 80%, critical ones all of it; a request shed for its
// class takes nothing and names its class; the limit is never exceeded.
func TestPriorityShedsLowestFirst(t *testing.T) {
	for _, tc := range []struct{ name, rule, reason string }{
		{"token bucket", `"algorithm_config": {"rate": 1, "period": "1h", "burst": 10}`, engine.ReasonTokenBucket},
		{"concurrency", `"algorithm": "concurrency", "algorithm_config": {"max_in_flight": 10, "lease_ttl": "1h"}`, engine.ReasonConcurrency},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e, rs := adaptiveEngine(t, `{"rules": [{"name": "r", "limit_keys": ["global"], "priority_from": "header:x-priority", "reserve": "20%", `+tc.rule+`}]}`)
			ctx := context.Background()
			take := func(class string) *engine.Outcome {
				return e.Decide(ctx, rs, values{"header:x-priority": class})
			}
			allowed := 0
			for _, step := range []struct {
				class string
				n     int // allowed before it is shed
			}{{"batch", 6}, {"sheddable", 1}, {"default", 1}, {"critical", 2}} {
				for i := range step.n {
					if out := take(step.class); !out.Allowed {
						t.Fatalf("%s request %d: denied (%s)", step.class, i+1, out.Reason)
					}
					allowed++
				}
				out := take(step.class)
				if out.Allowed {
					t.Fatalf("%s past its share: allowed", step.class)
				}
				want := engine.ReasonShed
				if step.class == "critical" {
					want = tc.reason // the limit itself
				}
				if out.Reason != want || out.Shed != step.class {
					t.Fatalf("%s past its share: %s, class %q; want %s, %q", step.class, out.Reason, out.Shed, want, step.class)
				}
				if left := out.Applied[0].Decision.Remaining; left != int64(10-allowed) {
					t.Fatalf("%s shed: %d left, want %d (a shed request takes nothing)", step.class, left, 10-allowed)
				}
			}
			if allowed != 10 {
				t.Fatalf("%d allowed, want the limit, 10", allowed)
			}
		})
	}
}

// TestAdaptiveWaitsUntil: a request waiting in an adaptive rule's queue
// counts in WaitsUntil, so a graceful shutdown waits for it too.
func TestAdaptiveWaitsUntil(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e, rs := adaptiveEngine(t, `{"rules": [{"name": "up", "limit_keys": ["global"], "algorithm": "adaptive",
		  "algorithm_config": {"initial_limit": 1, "min_limit": 1, "max_limit": 1}, "max_wait": "1s", "max_queue": 4}]}`)
		ctx := t.Context()
		held := e.Decide(ctx, rs, values{})
		if !held.Allowed {
			t.Fatal("the first request was refused")
		}
		if got := e.WaitsUntil(); !got.IsZero() {
			t.Errorf("with none waiting: %v, want zero", got)
		}
		start := time.Now()
		done := make(chan bool)
		go func() {
			out := e.Decide(ctx, rs, values{})
			if out.Allowed {
				out.Release(ctx)
			}
			done <- out.Allowed
		}()
		synctest.Wait()
		if got, want := e.WaitsUntil(), start.Add(time.Second); !got.Equal(want) {
			t.Errorf("with one waiting: %v after the start, want %v", got.Sub(start), want.Sub(start))
		}
		held.Release(ctx)
		if !<-done {
			t.Error("the waiter was not served once the slot came free")
		}
		if got := e.WaitsUntil(); !got.IsZero() {
			t.Errorf("once it passed: %v, want zero", got)
		}
	})
}
