package leased_test

import (
	"context"
	"strconv"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/driplimit/drip"
	"github.com/driplimit/drip/bucket"
	"github.com/driplimit/drip/engine"
	"github.com/driplimit/drip/rules"
	"github.com/driplimit/drip/store"
	"github.com/driplimit/drip/store/leased"
	"github.com/driplimit/drip/store/memstore"
)

// BenchmarkPassThrough is what drip serve's wrapper costs the rules that
// are not leased: the engine's Decide of a plain rule over 1000 clients on
// the memory store, alone ("direct") and under leased.Marked ("marked"),
// which passes each call to the store as it is. Run it with -cpu 1 and
// compare cpu-ns/op (the process's CPU time per decision) of one run.
func BenchmarkPassThrough(b *testing.B) {
	set, err := rules.Parse([]byte(`{"rules": [
	  {"name": "per-key", "limit_keys": ["header:x-tenant"], "algorithm_config": {"rate": 1000000, "period": "1s"}}]}`), "rules.json")
	if err != nil {
		b.Fatal(err)
	}
	for _, c := range []struct {
		name string
		wrap func(store.Store) store.Store
	}{
		{"direct", func(s store.Store) store.Store { return s }},
		{"marked", func(s store.Store) store.Store {
			ls, err := leased.New(s, leased.Marked())
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { ls.Close() })
			return ls
		}},
	} {
		b.Run(c.name, func(b *testing.B) {
			ms := memstore.New()
			defer ms.Close()
			e := engine.New(c.wrap(ms))
			defer e.Close()
			rs := e.Compile(set)
			vs := make([]request, 1000)
			for i := range vs {
				vs[i] = request{tenant: "client-" + strconv.Itoa(i)}
				e.Decide(context.Background(), rs, vs[i]) // the buckets exist
			}
			ctx := context.Background()
			b.ReportAllocs()
			b.ResetTimer()
			start := processCPU()
			for i := range b.N {
				if !e.Decide(ctx, rs, vs[i%len(vs)]).Allowed {
					b.Fatal("denied")
				}
			}
			b.ReportMetric(float64(processCPU()-start)/float64(b.N), "cpu-ns/op")
		})
	}
}

// processCPU is the process's CPU time so far, user and system.
func processCPU() time.Duration {
	var u syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &u); err != nil {
		panic(err)
	}
	return time.Duration(u.Utime.Nano() + u.Stime.Nano())
}

// BenchmarkColdKeys is what a leased instance adds to a take of a key it
// does not lease (one that has not proved hot): 10,000 keys taken in
// turn, each about once a second of the instance's clock (one that runs
// 10,000 times as fast as the real one), on the memory store leased as a remote one
// (leased.LeaseInProcess), against the memory store alone ("plain").
// Compare cpu-ns/op and allocs/op.
func BenchmarkColdKeys(b *testing.B) {
	const keys = 10_000
	for _, mode := range []string{"plain", "leased"} {
		b.Run(mode, func(b *testing.B) {
			ms := memstore.New()
			defer ms.Close()
			var st store.Store = ms
			var ls *leased.Store
			// The instance's clock runs 10,000 times as fast as the real
			// one: each key sees about one take a second of it.
			base := time.Now()
			fast := func() time.Time { return base.Add(10_000 * time.Since(base)) }
			if mode == "leased" {
				var err error
				ls, err = leased.New(ms, leased.LeaseInProcess(), leased.WithClock(fast))
				if err != nil {
					b.Fatal(err)
				}
				defer ls.Close()
				st = ls
			}
			lim := drip.PerSecond(1_000_000).WithBurst(1_000_000)
			items := make([]bucket.Prepared, keys)
			for k := range items {
				key := "cold:" + strconv.Itoa(k)
				p, err := lim.Params(key)
				if err != nil {
					b.Fatal(err)
				}
				if err := store.Prepare(&items[k], bucket.Take, key, &p, 1, false, ""); err != nil {
					b.Fatal(err)
				}
			}
			var next atomic.Int64
			b.ReportAllocs()
			b.ResetTimer()
			start := processCPU()
			b.RunParallel(func(pb *testing.PB) {
				res := make([]bucket.Result, 1)
				i := int(next.Add(1) * 7919)
				for pb.Next() {
					i++
					if err := st.Apply(context.Background(), bucket.Take, time.Time{}, items[i%keys:i%keys+1], res); err != nil {
						b.Error(err)
						return
					}
				}
			})
			b.ReportMetric(float64(processCPU()-start)/float64(b.N), "cpu-ns/op")
			if ls != nil {
				if st := ls.Stats(); st.Fetched > 0 {
					b.Errorf("%d blocks taken: keys proved hot", st.Fetched)
				}
			}
		})
	}
}
