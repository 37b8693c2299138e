package leased_test

import (
	"context"
	"strconv"
	"syscall"
	"testing"
	"time"

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
