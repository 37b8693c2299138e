package memstore_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/driplimit/drip"
	"github.com/driplimit/drip/bucket"
	"github.com/driplimit/drip/store/memstore"
	"github.com/driplimit/drip/storetest"
)

// BenchmarkTakeHotKey is one key through the Limiter, the path users call.
func BenchmarkTakeHotKey(b *testing.B) {
	s := memstore.New()
	defer s.Close()
	l := drip.New(s, drip.PerSecond(100))
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		l.Take(ctx, "hot")
	}
}

// BenchmarkLeases: acquire+release pairs on one key, 64 clients, beside
// 0 or more leases held (storetest.BenchLeases).
func BenchmarkLeases(b *testing.B) {
	for _, holders := range []int{0, 1000, 9000, 100_000} {
		b.Run(fmt.Sprint("holders=", holders), func(b *testing.B) {
			s := memstore.New()
			defer s.Close()
			storetest.BenchLeases(b, s, holders)
		})
	}
}

// BenchmarkLeaseFlood: an acquire on a key the store does not hold, one
// caller, below the bound on keys (a store with room for every key) and
// at it (the store full of 1,048,576 lease sets, so that every new key
// evicts one): the cost of a new key must not depend on how full the
// store is. Run it with a fixed count (-benchtime 200000x): the fill is
// made again for every count the benchmark tries.
func BenchmarkLeaseFlood(b *testing.B) {
	lim := drip.InFlight(5, time.Hour)
	ctx := context.Background()
	at := time.Unix(1_700_000_000, 0)
	for _, full := range []bool{false, true} {
		b.Run(fmt.Sprint("full=", full), func(b *testing.B) {
			opts := []memstore.Option{memstore.WithSweep(0)}
			if !full {
				opts = append(opts, memstore.WithMaxKeys(memstore.DefaultMaxKeys+4*b.N))
			}
			s := memstore.New(opts...)
			defer s.Close()
			if full {
				for i := range memstore.DefaultMaxKeys {
					if _, err := storetest.Apply(ctx, s, bucket.Take, at, drip.Request{Key: fmt.Sprint("fill:", i), Limit: lim, Lease: "a"}); err != nil {
						b.Fatal(err)
					}
				}
			}
			keys := make([]string, b.N)
			for i := range keys {
				keys[i] = fmt.Sprint("new:", i)
			}
			b.ResetTimer()
			for i := range b.N {
				d, err := storetest.Apply(ctx, s, bucket.Take, at.Add(time.Duration(i)), drip.Request{Key: keys[i], Limit: lim, Lease: "a"})
				if err != nil || !d.Allowed {
					b.Fatal(d, err)
				}
			}
		})
	}
}
