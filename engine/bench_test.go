package engine_test

import (
	"context"
	"strconv"
	"testing"

	"github.com/driplimit/drip/engine"
	"github.com/driplimit/drip/internal/cputime"
	"github.com/driplimit/drip/rules"
	"github.com/driplimit/drip/store/memstore"
)

// benchDecide measures Decide on the memory store: one enforce rule and
// one shadow rule keyed by a header, over 1000 clients, so that every
// decision makes two store calls. Besides ns/op it reports cpu-ns/op, the
// process's CPU time per decision, which other work on a shared machine
// disturbs much less than the wall time (run it with -cpu 1).
func benchDecide(b *testing.B, opts ...engine.Option) {
	set, err := rules.Parse([]byte(`{"rules": [
	  {"name": "per-key", "limit_keys": ["header:x-api-key"], "algorithm_config": {"rate": 1000000, "period": "1s"}},
	  {"name": "watch", "mode": "shadow", "limit_keys": ["header:x-api-key"], "algorithm_config": {"rate": 1000000, "period": "1s"}}]}`), "rules.json")
	if err != nil {
		b.Fatal(err)
	}
	store := memstore.New()
	defer store.Close()
	e := engine.New(store, opts...)
	defer e.Close()
	rs := e.Compile(set)
	vs := make([]values, 1000)
	for i := range vs {
		vs[i] = values{"header:x-api-key": "client-" + strconv.Itoa(i)}
		e.Decide(context.Background(), rs, vs[i]) // the buckets exist
	}
	ctx := context.Background()
	b.ReportAllocs()
	b.ResetTimer()
	start := cputime.Process()
	for i := range b.N {
		if !e.Decide(ctx, rs, vs[i%len(vs)]).Allowed {
			b.Fatal("denied")
		}
	}
	cputime.Report(b, start)
}

// BenchmarkDecide is the engine without tracing.
func BenchmarkDecide(b *testing.B) { benchDecide(b) }
