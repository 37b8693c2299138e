// Package stalltest checks a store against a stalled server (Redis under
// CLIENT PAUSE, a PostgreSQL table under LOCK TABLE): callers with short
// deadlines get errors at their deadlines, the goroutines and calls in
// flight stay bounded while the server is stalled, and, once it runs again,
// none of the requests that got an error was applied.
package stalltest

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/driplimit/drip"
	"github.com/driplimit/drip/bucket"
	"github.com/driplimit/drip/store"
	"github.com/driplimit/drip/storetest"
)

// Limit refills so little during a test (a token an hour) that its bucket
// shows every token taken.
var Limit = drip.Limit{Rate: 1, Period: time.Hour, Burst: 10}

// Slots is the concurrency limit of a key's companion SlotsKey: leases
// that last long enough to show every slot acquired.
var Slots = drip.InFlight(10, time.Hour)

// SlotsKey is the key of key's concurrency limit.
func SlotsKey(key string) string { return key + ":slots" }

// Load is a load run against a stalled server.
type Load struct {
	Callers  int           // goroutines taking in a loop
	Deadline time.Duration // each take's deadline
	For      time.Duration // how long they run (within the stall)
	Keys     []string      // taken in turn
	Multi    bool          // every fourth take is a multi-take of two keys
	Leases   bool          // every third take also acquires a slot (Slots) of the key's SlotsKey, in one multi-take
	// Running, if set, is the number of store calls in flight (the
	// batcher's), sampled during the run.
	Running func() int
}

// Report is what a Load saw.
type Report struct {
	Takes, Errors  int64
	Late           time.Duration // the longest a caller waited past its deadline
	Goroutines     int           // before the run
	PeakGoroutines int           // most during the run
	PeakRunning    int
}

func (r Report) String() string {
	return fmt.Sprintf("%d takes, %d errors; callers returned at most %v after their deadline; goroutines %d before, at most %d during; at most %d store calls in flight",
		r.Takes, r.Errors, r.Late.Round(time.Millisecond), r.Goroutines, r.PeakGoroutines, r.PeakRunning)
}

// Run runs l against st, which the caller has just stalled; every take
// must fail. It returns what it saw; the caller checks the bounds it
// expects and, once the server runs again, NothingTaken.
func Run(t *testing.T, st store.Store, l Load) Report {
	t.Helper()
	res := Report{Goroutines: runtime.NumGoroutine()}
	var takes, errs, ok atomic.Int64
	var late atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := range l.Callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				ctx, cancel := context.WithTimeout(context.Background(), l.Deadline)
				start := time.Now()
				var err error
				k := l.Keys[i%len(l.Keys)]
				switch {
				case l.Leases && i%3 == 2:
					rs := []drip.Request{{Key: k, Limit: Limit, Cost: 1}, {Key: SlotsKey(k), Limit: Slots, Lease: store.NewLeaseID()}}
					_, err = drip.Apply(ctx, st, bucket.Take, time.Time{}, rs...)
				case l.Multi && i%4 == 3 && len(l.Keys) > 1:
					rs := []drip.Request{{Key: l.Keys[i%len(l.Keys)], Limit: Limit, Cost: 1}, {Key: l.Keys[(i+1)%len(l.Keys)], Limit: Limit, Cost: 1}}
					_, err = drip.Apply(ctx, st, bucket.Take, time.Time{}, rs...)
				default:
					_, err = storetest.Apply(ctx, st, bucket.Take, time.Time{}, drip.Request{Key: k, Limit: Limit, Cost: 1})
				}
				over := time.Since(start) - l.Deadline
				cancel()
				takes.Add(1)
				if err != nil {
					errs.Add(1)
				} else {
					ok.Add(1)
				}
				for {
					m := late.Load()
					if int64(over) <= m || late.CompareAndSwap(m, int64(over)) {
						break
					}
				}
			}
		}()
	}
	end := time.After(l.For)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
sample:
	for {
		select {
		case <-end:
			break sample
		case <-tick.C:
			res.PeakGoroutines = max(res.PeakGoroutines, runtime.NumGoroutine())
			if l.Running != nil {
				res.PeakRunning = max(res.PeakRunning, l.Running())
			}
		}
	}
	close(stop)
	wg.Wait()
	res.Takes, res.Errors, res.Late = takes.Load(), errs.Load(), time.Duration(late.Load())
	if ok.Load() != 0 {
		t.Errorf("%d takes succeeded on a stalled server", ok.Load())
	}
	return res
}

// NothingTaken checks, once the server runs again and has finished what
// was sent to it during the stall, that every key of keys still holds its
// whole burst: a take of the burst is allowed, to the exact token (a late
// take applied would leave less); and that its SlotsKey has every slot
// free (a late acquire applied would hold one).
func NothingTaken(t *testing.T, st store.Store, keys []string) {
	t.Helper()
	for _, k := range keys {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		d, err := storetest.Apply(ctx, st, bucket.Take, time.Time{}, drip.Request{Key: k, Limit: Limit, Cost: Limit.Burst})
		cancel()
		if err != nil {
			t.Fatalf("%s: %v", k, err)
		}
		if !d.Allowed || d.Remaining != 0 {
			t.Errorf("%s: a take of the whole burst: allowed %v, %v tokens left; want allowed with 0 left: requests answered with errors were applied", k, d.Allowed, d.Tokens)
		}
		ctx, cancel = context.WithTimeout(context.Background(), 30*time.Second)
		d, err = storetest.Apply(ctx, st, bucket.Peek, time.Time{}, drip.Request{Key: SlotsKey(k), Limit: Slots})
		cancel()
		if err != nil {
			t.Fatalf("%s: %v", SlotsKey(k), err)
		}
		if d.Remaining != int64(Slots.MaxInFlight) {
			t.Errorf("%s: %d slots free, want %d: acquires answered with errors were applied", SlotsKey(k), d.Remaining, Slots.MaxInFlight)
		}
	}
}
