package engine_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/driplimit/drip"
	"github.com/driplimit/drip/bucket"
	"github.com/driplimit/drip/engine"
	"github.com/driplimit/drip/store"
	"github.com/driplimit/drip/store/memstore"
)

// paced is a store that takes its time: each call waits delay(n, now)
// (n counts calls from 0) before the memory store decides it, or until
// its context ends, and then it decides nothing. It runs in a synctest
// bubble, so the waits are virtual.
type paced struct {
	store.Store
	n     atomic.Int64
	delay func(n int64, now time.Time) time.Duration
}

func (p *paced) Apply(ctx context.Context, op bucket.Op, at time.Time, items []bucket.Prepared, results []bucket.Result) error {
	if len(items) != 1 {
		return p.Store.Apply(ctx, op, at, items, results)
	}
	t := time.NewTimer(p.delay(p.n.Add(1)-1, time.Now()))
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
		return ctx.Err()
	}
	return p.Store.Apply(ctx, op, at, items, results)
}

// Caps are the store's, but not InProcess: it stands for a store on a
// server, whose calls get a deadline.
func (p *paced) Caps() store.Caps {
	c := p.Store.Caps()
	c.InProcess = false
	return c
}

// states records the breaker's changes of state with their (virtual)
// times.
type states struct {
	engine.NopObserver
	mu  sync.Mutex
	log []change
}

type change struct {
	state string
	at    time.Time
}

func (s *states) BreakerState(st string) {
	s.mu.Lock()
	s.log = append(s.log, change{st, time.Now()})
	s.mu.Unlock()
}

func (s *states) changes() []change {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]change(nil), s.log...)
}

// load runs callers that each make calls one after another until stop,
// and returns the errors by kind and the number of calls. A budget other
// than 0 is each call's own deadline (a caller's, such as a gRPC
// deadline).
func load(e *engine.Engine, callers int, budget time.Duration, stop time.Time) (calls int64, errs map[string]int) {
	var mu sync.Mutex
	errs = map[string]int{}
	var n atomic.Int64
	var wg sync.WaitGroup
	for c := range callers {
		wg.Go(func() {
			req := []drip.Request{{Key: "hot", Limit: drip.PerSecond(1e6), Cost: 1}}
			for i := 0; time.Now().Before(stop); i++ {
				req[0].Key = []string{"hot", "k1", "k2"}[(c+i)%3]
				ctx, cancel := context.Background(), context.CancelFunc(func() {})
				if budget > 0 {
					ctx, cancel = context.WithTimeout(ctx, budget)
				}
				_, err := e.Apply(ctx, bucket.Take, req, nil)
				cancel()
				n.Add(1)
				if err != nil {
					mu.Lock()
					switch {
					case errors.Is(err, engine.ErrBreakerOpen):
						errs["breaker open"]++
					case errors.Is(err, engine.ErrStalled),
						strings.Contains(err.Error(), "answered nothing within the deadline"):
						// A stalled call, or a probe whose deadline (the
						// stall time) came first.
						errs["stalled"]++
					default:
						errs[err.Error()]++
					}
					mu.Unlock()
					time.Sleep(time.Millisecond) // as a client would, after an error
				}
			}
		})
	}
	wg.Wait()
	return n.Load(), errs
}

// TestSlowIsNotDown: a store that is slow for a moment (a 0.3 s pause of
// everything, and now and then one call that takes 0.7 s, longer than the
// stall time, while the others answer) makes decisions slower, never
// failed, and the breaker stays closed.
func TestSlowIsNotDown(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ms := memstore.New(memstore.WithSweep(0))
		defer ms.Close()
		t0 := time.Now()
		pauseFrom, pauseTo := t0.Add(2*time.Second), t0.Add(2300*time.Millisecond)
		st := &paced{Store: ms, delay: func(n int64, now time.Time) time.Duration {
			switch {
			case !now.Before(pauseFrom) && now.Before(pauseTo):
				return pauseTo.Sub(now) + time.Millisecond
			case n%50 == 49:
				return 700 * time.Millisecond
			}
			return 2 * time.Millisecond
		}}
		obs := &states{}
		e := engine.New(st, engine.WithObserver(obs))
		defer e.Close()
		calls, errs := load(e, 8, 0, t0.Add(8*time.Second))
		if len(errs) != 0 {
			t.Errorf("%d calls, errors: %v", calls, errs)
		}
		if ch := obs.changes(); len(ch) != 0 {
			t.Errorf("the breaker changed state: %v", ch)
		}
		if calls < 1000 {
			t.Errorf("only %d calls", calls)
		}
	})
}

// TestDownOpensQuickly: a store that answers nothing for 3 s opens the
// breaker within a second (its stall time, 0.5 s, after the first call
// that waits), calls then fail at once with ErrBreakerOpen, and within a
// second of the store answering again the breaker is closed and calls
// succeed.
func TestDownOpensQuickly(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ms := memstore.New(memstore.WithSweep(0))
		defer ms.Close()
		t0 := time.Now()
		downFrom, downTo := t0.Add(time.Second), t0.Add(4*time.Second)
		st := &paced{Store: ms, delay: func(_ int64, now time.Time) time.Duration {
			if !now.Before(downFrom) && now.Before(downTo) {
				return downTo.Sub(now) + time.Millisecond
			}
			return 2 * time.Millisecond
		}}
		obs := &states{}
		e := engine.New(st, engine.WithObserver(obs))
		defer e.Close()
		_, errs := load(e, 8, 0, t0.Add(10*time.Second))
		ch := obs.changes()
		if len(ch) < 3 || ch[0].state != engine.BreakerOpen {
			t.Fatalf("breaker changes %v, errors %v", ch, errs)
		}
		if d := ch[0].at.Sub(downFrom); d > time.Second {
			t.Errorf("the breaker opened %v after the store went down, want within 1s", d)
		}
		last := ch[len(ch)-1]
		if last.state != engine.BreakerClosed || last.at.Before(downTo) || last.at.Sub(downTo) > time.Second {
			t.Errorf("last change %v, want closed within 1s of %v: %v", last, downTo, ch)
		}
		// While it was down, calls failed fast instead of waiting: the
		// stalled ones (8 callers, and each failed probe), then the
		// breaker's refusals.
		if errs["breaker open"] < 1000 || errs["stalled"] == 0 || len(errs) != 2 {
			t.Errorf("errors %v", errs)
		}
		if e.BreakerState() != engine.BreakerClosed {
			t.Errorf("breaker %s at the end", e.BreakerState())
		}
	})
}

// TestLateWhileAnswering: calls that miss a short deadline while the
// store answers the others are slow decisions, not failures: they fail
// (the caller's deadline is the caller's), but the breaker stays closed.
func TestLateWhileAnswering(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ms := memstore.New(memstore.WithSweep(0))
		defer ms.Close()
		st := &paced{Store: ms, delay: func(n int64, _ time.Time) time.Duration {
			if n%5 == 4 {
				return 200 * time.Millisecond
			}
			return 2 * time.Millisecond
		}}
		obs := &states{}
		e := engine.New(st, engine.WithObserver(obs), engine.WithTimeout(100*time.Millisecond))
		defer e.Close()
		_, errs := load(e, 8, 0, time.Now().Add(5*time.Second))
		late := 0
		for msg, n := range errs {
			if msg == "breaker open" || msg == "stalled" {
				t.Errorf("%d calls: %s", n, msg)
			}
			late += n
		}
		if late == 0 {
			t.Error("no call missed its deadline")
		}
		if ch := obs.changes(); len(ch) != 0 {
			t.Errorf("the breaker changed state: %v", ch)
		}
	})
}

// lateReturn is a store whose calls return their deadline error late, as
// they do in a process starved of CPU: the goroutine that should have
// returned at the deadline ran much later.
type lateReturn struct{ store.Store }

func (lateReturn) Apply(ctx context.Context, _ bucket.Op, _ time.Time, _ []bucket.Prepared, _ []bucket.Result) error {
	<-ctx.Done()
	time.Sleep(300 * time.Millisecond)
	return ctx.Err()
}

func (lateReturn) Caps() store.Caps { return store.Caps{} }

// TestStarvedDeadlines: calls whose deadline errors come back long after
// the deadline (this process, not the store, was slow) fail, but do not
// count against the store: the breaker stays closed.
func TestStarvedDeadlines(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		obs := &states{}
		e := engine.New(lateReturn{}, engine.WithObserver(obs), engine.WithTimeout(100*time.Millisecond))
		defer e.Close()
		req := []drip.Request{{Key: "k", Limit: drip.PerSecond(10), Cost: 1}}
		var wg sync.WaitGroup
		for range 8 {
			wg.Go(func() {
				for range 5 {
					if _, err := e.Apply(context.Background(), bucket.Take, req, nil); !errors.Is(err, context.DeadlineExceeded) {
						t.Errorf("err %v", err)
					}
				}
			})
		}
		wg.Wait()
		if ch := obs.changes(); len(ch) != 0 {
			t.Errorf("the breaker changed state: %v", ch)
		}
	})
}

// TestDownOpensQuicklyShortCallers: callers whose own deadline (100 ms) is
// shorter than the stall time (a gRPC deadline, Envoy's timeout) each give
// up before any one call has waited the stall time. A store that answers
// none of them still opens the breaker within a second, and it closes
// within a second of the store answering again; a 0.3 s pause before that
// fails the calls it holds up (their callers' deadlines) but opens
// nothing.
func TestDownOpensQuicklyShortCallers(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ms := memstore.New(memstore.WithSweep(0))
		defer ms.Close()
		t0 := time.Now()
		pauseFrom, pauseTo := t0.Add(time.Second), t0.Add(1300*time.Millisecond)
		downFrom, downTo := t0.Add(3*time.Second), t0.Add(6*time.Second)
		st := &paced{Store: ms, delay: func(_ int64, now time.Time) time.Duration {
			switch {
			case !now.Before(pauseFrom) && now.Before(pauseTo):
				return pauseTo.Sub(now) + time.Millisecond
			case !now.Before(downFrom) && now.Before(downTo):
				return downTo.Sub(now) + time.Millisecond
			}
			return 2 * time.Millisecond
		}}
		obs := &states{}
		e := engine.New(st, engine.WithObserver(obs))
		defer e.Close()
		_, errs := load(e, 8, 100*time.Millisecond, t0.Add(9*time.Second))
		ch := obs.changes()
		if len(ch) < 3 || ch[0].state != engine.BreakerOpen {
			t.Fatalf("breaker changes %v, errors %v", ch, errs)
		}
		if ch[0].at.Before(downFrom) {
			t.Errorf("the breaker opened at %v, before the store went down (a 0.3 s pause): %v", ch[0].at.Sub(t0), ch)
		}
		if d := ch[0].at.Sub(downFrom); d > time.Second {
			t.Errorf("the breaker opened %v after the store went down, want within 1s", d)
		}
		last := ch[len(ch)-1]
		if last.state != engine.BreakerClosed || last.at.Before(downTo) || last.at.Sub(downTo) > time.Second {
			t.Errorf("last change %v, want closed within 1s of %v: %v", last, downTo, ch)
		}
	})
}

// panicky is a store that is down (failing) until up is set, and panics
// while panic is set.
type panicky struct {
	store.Store
	down, panics atomic.Bool
}

var errDown2 = errors.New("down")

func (p *panicky) Apply(ctx context.Context, op bucket.Op, at time.Time, items []bucket.Prepared, results []bucket.Result) error {
	if len(items) != 1 {
		return p.Store.Apply(ctx, op, at, items, results)
	}
	if p.panics.Load() {
		panic("store bug")
	}
	if p.down.Load() {
		return errDown2
	}
	return p.Store.Apply(ctx, op, at, items, results)
}

// Caps are the store's, but not InProcess: it stands for a store on a
// server, whose calls get a deadline.
func (p *panicky) Caps() store.Caps {
	c := p.Store.Caps()
	c.InProcess = false
	return c
}

// TestProbePanics: a probe whose store call panics does not leave the
// breaker half-open for good: the next call is the probe.
func TestProbePanics(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ms := memstore.New(memstore.WithSweep(0))
		defer ms.Close()
		st := &panicky{Store: ms}
		e := engine.New(st)
		defer e.Close()
		req := []drip.Request{{Key: "k", Limit: drip.PerSecond(10), Cost: 1}}
		st.down.Store(true)
		for range 5 {
			e.Apply(context.Background(), bucket.Take, req, nil)
		}
		if e.BreakerState() != engine.BreakerOpen {
			t.Fatalf("breaker %s after 5 failures", e.BreakerState())
		}
		time.Sleep(time.Second) // past the cool-down
		st.panics.Store(true)
		func() {
			defer func() { recover() }()
			e.Apply(context.Background(), bucket.Take, req, nil)
		}()
		st.panics.Store(false)
		st.down.Store(false)
		if _, err := e.Apply(context.Background(), bucket.Take, req, nil); err != nil || e.BreakerState() != engine.BreakerClosed {
			t.Fatalf("after a panicking probe: %v, breaker %s", err, e.BreakerState())
		}
	})
}
