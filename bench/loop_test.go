package bench

import (
	"context"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// decider makes one decision for key and says whether it was allowed.
type decider func(ctx context.Context, key string) (bool, error)

// loadRun is what closedLoop measured.
type loadRun struct {
	lat     []time.Duration // each decision's latency, sorted
	elapsed time.Duration
	denied  int64
	cpu     time.Duration // this process's CPU time over the run
}

// closedLoop makes b.N decisions from callers goroutines, each asking its
// next as soon as the last is answered, on the key "hot" or on keys chosen
// uniformly (caller w draws from a generator seeded with w and seed), and
// fails b on the first error.
func closedLoop(b *testing.B, callers int, hot bool, seed uint64, decide decider) loadRun {
	return closedLoopN(b, b.N, callers, hot, seed, decide)
}

// closedLoopN is closedLoop making n decisions.
func closedLoopN(b *testing.B, n, callers int, hot bool, seed uint64, decide decider) loadRun {
	ctx := context.Background()
	var next atomic.Int64
	lat := make([][]time.Duration, callers)
	var wg sync.WaitGroup
	var failed atomic.Pointer[error]
	var denied atomic.Int64
	b.ResetTimer()
	cpu := processCPU()
	start := time.Now()
	for w := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), seed))
			for next.Add(1) <= int64(n) {
				key := "hot"
				if !hot {
					key = keys[rng.IntN(keyCount)]
				}
				t := time.Now()
				ok, err := decide(ctx, key)
				if err != nil {
					failed.CompareAndSwap(nil, &err)
					return
				}
				lat[w] = append(lat[w], time.Since(t))
				if !ok {
					denied.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	r := loadRun{elapsed: time.Since(start)}
	r.cpu = processCPU() - cpu
	b.StopTimer()
	if err := failed.Load(); err != nil {
		b.Fatal(*err)
	}
	r.lat = slices.Concat(lat...)
	slices.Sort(r.lat)
	r.denied = denied.Load()
	return r
}

// processCPU is the CPU time this process has used (user + system): the
// callers, the client library and the benchmark's own bookkeeping.
func processCPU() time.Duration {
	var u syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &u); err != nil {
		panic(err)
	}
	return time.Duration(u.Utime.Nano() + u.Stime.Nano())
}
