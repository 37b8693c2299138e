package store_test

import (
	"context"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/driplimit/drip"
	"github.com/driplimit/drip/bucket"
	"github.com/driplimit/drip/store"
	"github.com/driplimit/drip/store/memstore"
	"github.com/driplimit/drip/storetest"
)

// TestShardedWindows sums the grants of a sharded key over every window
// and checks that together the shards never grant more than the whole
// limit could: for a fixed window or an interval refill, the burst within
// each window of the key's grid; for a continuous refill, the burst plus
// one period's rate within any period.
func TestShardedWindows(t *testing.T) {
	const period = time.Second
	for _, l := range []drip.Limit{
		drip.Per(8, period).Window(),
		drip.Per(8, period).Window().WithBurst(12),
		drip.Per(8, period).WithRefill(drip.Interval),
		drip.Per(8, period).WithRefill(drip.Interval).WithBurst(12),
		drip.Per(8, period),
	} {
		t.Run(l.String(), func(t *testing.T) {
			s := memstore.New(memstore.WithSweep(0))
			defer s.Close()
			sh := store.Sharded{Store: s, N: 4}
			rng := rand.New(rand.NewPCG(1, 2))
			base := time.Unix(1_000_000, 0)
			var grants []time.Duration
			for at := time.Duration(0); at < 40*period; at += time.Duration(rng.IntN(60)) * time.Millisecond {
				d, err := storetest.Apply(context.Background(), sh, bucket.Take, base.Add(at), drip.Request{Key: "hot", Limit: l, Cost: 1})
				if err != nil {
					t.Fatal(err)
				}
				if d.Allowed {
					grants = append(grants, at)
				}
			}
			burst := l.Burst
			if burst == 0 {
				burst = l.Rate
			}
			if l.Algorithm != drip.FixedWindow && l.Refill != drip.Interval {
				// Continuous: any period holds at most burst + rate.
				for i, a := range grants {
					n := 0
					for _, g := range grants[i:] {
						if g < a+period {
							n++
						}
					}
					if float64(n) > burst+l.Rate {
						t.Fatalf("%d grants in the period from %v, want at most %v", n, a, burst+l.Rate)
					}
				}
				return
			}
			// The key's grid, counted from base.
			off := time.Duration(base.UnixNano()-int64(store.WindowStart("hot", period))) % period
			count := map[time.Duration]int{}
			for _, g := range grants {
				count[(g+off)/period]++
			}
			total := 0
			for w, n := range count {
				if float64(n) > burst {
					t.Errorf("window %d: the shards granted %d, more than the burst %v", w, n, burst)
				}
				total += n
			}
			// And the shards use the limit: the load is far above it.
			if want := 40 * l.Rate * 0.9; float64(total) < want {
				t.Errorf("%d grants over 40 windows, want at least %v", total, want)
			}
		})
	}
}

// TestSharded checks that a sharded key never grants more than the whole
// limit, and that the two choices use nearly all of it.
func TestSharded(t *testing.T) {
	s := memstore.New()
	defer s.Close()
	sh := store.Sharded{Store: s, N: 4}
	at := time.Unix(1000, 0)
	granted := 0
	for range 200 {
		d, err := storetest.Apply(context.Background(), sh, bucket.Take, at, drip.Request{Key: "hot", Limit: drip.PerSecond(100), Cost: 1})
		if err != nil {
			t.Fatal(err)
		}
		if d.Allowed {
			granted++
		}
	}
	if granted > 100 || granted < 96 {
		t.Fatalf("4 shards of a 100-token burst granted %d, want 96..100", granted)
	}
	if err := sh.Reset(context.Background(), "hot"); err != nil {
		t.Fatal(err)
	}
	d, _ := storetest.Apply(context.Background(), sh, bucket.Take, at, drip.Request{Key: "hot", Limit: drip.PerSecond(100), Cost: 1})
	if !d.Allowed || d.Tokens != 24 {
		t.Fatalf("after reset: %+v", d)
	}
}
