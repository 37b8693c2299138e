package bench

// The memory store beside the in-process peers, in one process and one
// run, so that the ratios in BENCHMARKS.md compare like with like:
//
//	cd bench && go test -run '^$' -bench 'Keyed|HotKey|IdleBucket' -benchmem -count 5
//
// Every limiter holds the same limit: 100 per second, burst 100. Besides
// ns/op (wall time), the decision benchmarks report cpu-ns/op, the CPU
// time of the whole process per decision (all CPUs together, so about
// -cpu times ns/op on a quiet machine), which other work on a shared
// machine disturbs much less than the wall time.

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sethvargo/go-limiter/memorystore"
	"github.com/throttled/throttled/v2"
	throttledmem "github.com/throttled/throttled/v2/store/memstore"
	"golang.org/x/time/rate"

	"github.com/driplimit/drip"
	"github.com/driplimit/drip/store/memstore"
)

const (
	keyCount = 100_000
	perSec   = 100
)

var keys = func() []string {
	k := make([]string, keyCount)
	for i := range k {
		k[i] = fmt.Sprintf("user:%d", i)
	}
	return k
}()

// keyedLimiter is a peer's per-key decision.
type keyedLimiter interface{ allow(key string) bool }

// dripMem is drip's memory store through the Limiter users call.
type dripMem struct{ l *drip.Limiter }

func newDripMem(maxKeys int) *dripMem {
	return &dripMem{drip.New(memstore.New(memstore.WithMaxKeys(maxKeys)), drip.PerSecond(perSec))}
}

func (d *dripMem) allow(key string) bool {
	dec, err := d.l.Take(context.Background(), key)
	return err == nil && dec.Allowed
}

// dripAllow is the same limiter asked with Allow: a yes or no, on the
// memory store's direct path.
type dripAllow struct{ l *drip.Limiter }

func (d dripAllow) allow(key string) bool { return d.l.Allow(key) }

// xrate is golang.org/x/time/rate keyed the way users key it: one Limiter
// per key in a map (sync.Map, the faster of the two usual maps for a
// read-mostly key set).
type xrate struct{ m sync.Map }

func (x *xrate) allow(key string) bool {
	v, ok := x.m.Load(key)
	if !ok {
		v, _ = x.m.LoadOrStore(key, rate.NewLimiter(perSec, perSec))
	}
	return v.(*rate.Limiter).Allow()
}

type goLimiter struct {
	s interface {
		Take(context.Context, string) (uint64, uint64, uint64, bool, error)
	}
}

func newGoLimiter() *goLimiter {
	s, err := memorystore.New(&memorystore.Config{Tokens: perSec, Interval: time.Second})
	if err != nil {
		panic(err)
	}
	return &goLimiter{s}
}

func (g *goLimiter) allow(key string) bool {
	_, _, _, ok, _ := g.s.Take(context.Background(), key)
	return ok
}

type throttledGCRA struct{ rl *throttled.GCRARateLimiterCtx }

func newThrottled(maxKeys int) *throttledGCRA {
	st, err := throttledmem.NewCtx(maxKeys)
	if err != nil {
		panic(err)
	}
	rl, err := throttled.NewGCRARateLimiterCtx(st, throttled.RateQuota{MaxRate: throttled.PerSec(perSec), MaxBurst: perSec - 1})
	if err != nil {
		panic(err)
	}
	return &throttledGCRA{rl}
}

func (t *throttledGCRA) allow(key string) bool {
	limited, _, _ := t.rl.RateLimitCtx(context.Background(), key, 1)
	return !limited
}

func peers(maxKeys int) []struct {
	name string
	l    keyedLimiter
} {
	return []struct {
		name string
		l    keyedLimiter
	}{
		{"drip-memstore", newDripMem(maxKeys)},
		{"drip-allow", dripAllow{newDripMem(maxKeys).l}},
		{"x-time-rate", &xrate{}},
		{"go-limiter", newGoLimiter()},
		{"throttled-gcra", newThrottled(maxKeys)},
	}
}

// BenchmarkKeyed: 100,000 keys, parallel callers, cost 1.
func BenchmarkKeyed(b *testing.B) {
	for _, p := range peers(4 * keyCount) {
		for _, k := range keys { // warm: every key exists
			p.l.allow(k)
		}
		b.Run(p.name, func(b *testing.B) {
			var seq atomic.Uint64
			b.ReportAllocs()
			b.ResetTimer()
			defer reportCPU(b)()
			b.RunParallel(func(pb *testing.PB) {
				i := int(seq.Add(1) * 7919)
				for pb.Next() {
					p.l.allow(keys[i%keyCount])
					i++
				}
			})
		})
	}
}

// BenchmarkHotKey: one key, parallel callers; x/time/rate is one Limiter.
func BenchmarkHotKey(b *testing.B) {
	b.Run("drip-memstore", func(b *testing.B) {
		d := newDripMem(1024)
		b.ReportAllocs()
		defer reportCPU(b)()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				d.allow("hot")
			}
		})
	})
	b.Run("drip-allow", func(b *testing.B) {
		l := newDripMem(1024).l
		b.ReportAllocs()
		defer reportCPU(b)()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				l.Allow("hot")
			}
		})
	})
	b.Run("x-time-rate", func(b *testing.B) {
		l := rate.NewLimiter(perSec, perSec)
		b.ReportAllocs()
		defer reportCPU(b)()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				l.Allow()
			}
		})
	})
}

// BenchmarkIdleBucket reports the heap bytes per idle bucket with
// 1,000,000 keys held ("B/bucket"; keys are "user:N", 6 to 12 bytes).
func BenchmarkIdleBucket(b *testing.B) {
	const n = 1_000_000
	ks := make([]string, n)
	for i := range ks {
		ks[i] = fmt.Sprintf("user:%d", i)
	}
	for _, p := range []struct {
		name string
		mk   func() keyedLimiter
	}{
		{"drip-memstore", func() keyedLimiter { return newDripMem(2 * n) }},
		{"x-time-rate", func() keyedLimiter { return &xrate{} }},
		{"go-limiter", func() keyedLimiter { return newGoLimiter() }},
		{"throttled-gcra", func() keyedLimiter { return newThrottled(2 * n) }},
	} {
		b.Run(p.name, func(b *testing.B) {
			for range b.N {
				before := heap()
				l := p.mk()
				for _, k := range ks {
					l.allow(k)
				}
				after := heap()
				b.ReportMetric(float64(after-before)/n, "B/bucket")
				runtime.KeepAlive(l)
				runtime.KeepAlive(ks)
			}
		})
	}
}

// reportCPU starts counting the process's CPU time; the function it
// returns reports it per iteration as cpu-ns/op.
func reportCPU(b *testing.B) func() {
	start := processCPU()
	return func() { b.ReportMetric(float64(processCPU()-start)/float64(b.N), "cpu-ns/op") }
}

func heap() uint64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// floodKeys are distinct keys for BenchmarkFlood, three times the memory
// store's default bound, so that a flood keeps evicting; made once so that
// building them is not measured.
var floodKeys = sync.OnceValue(func() []string {
	k := make([]string, 3*memstore.DefaultMaxKeys)
	for i := range k {
		k[i] = fmt.Sprintf("flood:%d", i)
	}
	return k
})

// BenchmarkFlood: every decision on a key the store has not seen (or has
// evicted), as an attacker sending endless new keys, on the memory store
// with its default bound; one caller. It reports the buckets held and the
// live heap after the flood (after GC, less the key list's), which the
// bound must hold.
func BenchmarkFlood(b *testing.B) {
	ks := floodKeys()
	base := heap()
	s := memstore.New()
	defer s.Close()
	l := drip.New(s, drip.PerSecond(perSec))
	ctx := context.Background()
	for _, k := range ks[:memstore.DefaultMaxKeys] { // full: every new key evicts
		l.Take(ctx, k)
	}
	i := memstore.DefaultMaxKeys
	b.ReportAllocs()
	report := reportCPU(b)
	for b.Loop() {
		l.Take(ctx, ks[i])
		if i++; i == len(ks) {
			i = 0
		}
	}
	b.StopTimer()
	report()
	b.ReportMetric(float64(s.Len()), "buckets")
	b.ReportMetric(float64(int64(heap())-int64(base))/(1<<20), "MiB-heap")
	runtime.KeepAlive(s)
}
