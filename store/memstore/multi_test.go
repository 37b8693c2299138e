package memstore

import (
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/driplimit/drip"
	"github.com/driplimit/drip/bucket"
)

// TestMultiTakesConcurrent: multi-takes of overlapping keys in every
// order, some of more keys than the store keeps its lock list for on the
// stack, from 8 goroutines: none deadlocks (each shard is locked once, in
// one order), and each key granted exactly what the all-or-nothing
// takes that included it were granted, never over its burst.
func TestMultiTakesConcurrent(t *testing.T) {
	s := New(WithSweep(0))
	defer s.Close()
	at := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC) // no refill: a fixed instant
	const nkeys, burst = 40, 300
	limit := drip.Limit{Rate: 1, Period: time.Hour, Burst: burst}
	var mu sync.Mutex
	granted := make(map[string]int)
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(g), 7))
			for range 300 {
				n := 2 + rng.IntN(5)
				if rng.IntN(10) == 0 {
					n = 17 + rng.IntN(8) // past the 16 shards kept on the stack
				}
				reqs := make([]drip.Request, 0, n)
				for _, k := range rng.Perm(nkeys)[:n] {
					reqs = append(reqs, drip.Request{Key: fmt.Sprint("k", k), Limit: limit, Cost: 1})
				}
				m, err := drip.Apply(t.Context(), s, bucket.Take, at, reqs...)
				if err != nil {
					t.Error(err)
					return
				}
				if m.Allowed {
					mu.Lock()
					for _, r := range reqs {
						granted[r.Key]++
					}
					mu.Unlock()
				}
			}
		}()
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(2 * time.Minute): // a deadlock, not a slow machine
		t.Fatal("multi-takes did not finish: deadlocked")
	}
	for k := range nkeys {
		key := fmt.Sprint("k", k)
		m, err := drip.Apply(t.Context(), s, bucket.Peek, at, drip.Request{Key: key, Limit: limit})
		if err != nil {
			t.Fatal(err)
		}
		if g, d := granted[key], m.Decisions[0]; g > burst || d.Remaining != int64(burst-g) {
			t.Errorf("%s: granted %d, remaining %v: want at most %d granted and the rest remaining", key, g, d.Remaining, burst)
		}
	}
}
