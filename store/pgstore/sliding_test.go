package pgstore_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/driplimit/drip"
	"github.com/driplimit/drip/bucket"
	"github.com/driplimit/drip/store/pgstore"
	"github.com/driplimit/drip/storetest"
)

// slidingLimit is l as a sliding window of slots slots.
func slidingLimit(l drip.Limit, slots int) drip.Limit {
	l.Algorithm, l.Slots = drip.SlidingWindow, slots
	return l
}

// TestSlidingHammer: 16 callers taking at once from one sliding window of
// 50 an hour get exactly 50 (no count leaves the window during the test),
// one statement each and batched (same-key requests chained in
// batch.sql), and alone as in multi-takes beside a token bucket.
func TestSlidingHammer(t *testing.T) {
	for _, mode := range []struct {
		name  string
		opts  []pgstore.Option
		multi bool
	}{
		{"statement", []pgstore.Option{pgstore.WithoutBatching()}, false},
		{"batching", []pgstore.Option{pgstore.WithBatching(pgstore.Batching{MaxBatch: 64, InFlight: 4})}, false},
		{"multi", nil, true},
	} {
		t.Run(mode.name, func(t *testing.T) {
			st := newStore(t, mode.opts...)
			ctx := context.Background()
			p := prefix()
			lim := slidingLimit(drip.PerHour(50), 10)
			var granted atomic.Int64
			var wg sync.WaitGroup
			errs := make(chan error, 16)
			for range 16 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for range 10 {
						rs := []drip.Request{{Key: p + "hot", Limit: lim, Cost: 1}}
						if mode.multi {
							rs = append(rs, drip.Request{Key: p + "bucket", Limit: drip.PerHour(1000), Cost: 1})
						}
						m, err := drip.Apply(ctx, st, bucket.Take, time.Time{}, rs...)
						if err != nil {
							errs <- err
							return
						}
						if m.Allowed {
							granted.Add(1)
						}
					}
				}()
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Fatal(err)
			}
			if g := granted.Load(); g != 50 {
				t.Fatalf("granted %d of 160 takes, want the limit, 50", g)
			}
			d, err := storetest.Apply(ctx, st, bucket.Peek, time.Time{}, drip.Request{Key: p + "hot", Limit: lim, Cost: 1})
			if err != nil || d.Allowed || d.Remaining != 0 {
				t.Fatalf("peek after: %+v %v, want denied with none remaining", d, err)
			}
		})
	}
}

// TestSlidingKindChange: a key's row holds one kind's state; a decision of
// the other kind (a limit changed from a token bucket to a sliding window,
// or back) reads it as no state and starts afresh, and its write replaces
// it.
func TestSlidingKindChange(t *testing.T) {
	st := newStore(t)
	ctx := context.Background()
	key := prefix() + "k"
	win, tb := slidingLimit(drip.PerMinute(3), 6), drip.PerMinute(2)
	step := func(l drip.Limit, cost float64, at time.Duration) drip.Decision {
		t.Helper()
		d, err := storetest.Apply(ctx, st, bucket.Take, t0.Add(at), drip.Request{Key: key, Limit: l, Cost: cost})
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	if d := step(tb, 2, 0); !d.Allowed || d.Remaining != 0 {
		t.Fatalf("the bucket's burst: %+v", d)
	}
	if d := step(win, 3, time.Second); !d.Allowed || d.Remaining != 0 {
		t.Fatalf("the whole window on the bucket's key: %+v, want allowed (no state of its own)", d)
	}
	if d := step(win, 1, 2*time.Second); d.Allowed {
		t.Fatalf("the window's fourth: %+v, want denied", d)
	}
	if d := step(tb, 2, 3*time.Second); !d.Allowed || d.Remaining != 0 {
		t.Fatalf("the bucket again: %+v, want its whole burst (the window's row is no bucket)", d)
	}
}
