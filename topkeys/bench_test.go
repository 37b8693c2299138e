package topkeys_test

import (
	"context"
	"math/rand/v2"
	"strconv"
	"sync"
	"testing"
	"unsafe"

	"github.com/driplimit/drip/engine"
	"github.com/driplimit/drip/internal/cputime"
	"github.com/driplimit/drip/rules"
	"github.com/driplimit/drip/store/memstore"
	"github.com/driplimit/drip/topkeys"
)

type values map[string]string

func (v values) Value(s rules.Source) (string, bool) {
	x, ok := v[s.String()]
	return x, ok
}

func (v values) Identity(key string) string { return "key:" + key }

// Cost is 0, false: no rule here costs by a program's function.
func (v values) Cost(*rules.Rule) (float64, bool) { return 0, false }

// benchDecide is engine.Decide on the memory store, one enforce rule
// keyed by a header, over 100,000 clients: the path whose cost the
// tracker adds to (BENCHMARKS.md, "Who is being limited").
func benchDecide(b *testing.B, opts ...engine.Option) {
	set, err := rules.Parse([]byte(`{"rules": [
	  {"name": "per-key", "limit_keys": ["header:x-api-key"], "algorithm_config": {"rate": 1000000, "period": "1s"}}]}`), "rules.json")
	if err != nil {
		b.Fatal(err)
	}
	store := memstore.New()
	defer store.Close()
	e := engine.New(store, opts...)
	defer e.Close()
	rs := e.Compile(set)
	vs := make([]values, 100_000)
	for i := range vs {
		vs[i] = values{"header:x-api-key": "client-" + strconv.Itoa(i)}
		e.Decide(context.Background(), rs, vs[i]) // the buckets exist; the summaries' keys have room
	}
	ctx := context.Background()
	b.ReportAllocs()
	b.ResetTimer()
	start := cputime.Process()
	for i := range b.N {
		if !e.Decide(ctx, rs, vs[(i*7919)%len(vs)]).Allowed {
			b.Fatal("denied")
		}
	}
	cputime.Report(b, start)
}

// BenchmarkDecide: without a key observer, then with a Tracker.
func BenchmarkDecide(b *testing.B) {
	b.Run("without", func(b *testing.B) { benchDecide(b) })
	b.Run("topkeys", func(b *testing.B) { benchDecide(b, engine.WithKeys(topkeys.New())) })
}

// BenchmarkKey is the tracker's own cost per decision. Each key is built
// in place before it is counted, as the engine builds a decision's key
// (so it is in the CPU's cache, as there); "build" is that alone, to
// subtract. The workloads: Zipf over 100,000 keys (the 10 most frequent
// send 30% of the requests), and 1,000 keys in turn, where every
// decision is a key new to its counters (the worst case: Space-Saving
// replaces a counter each time). BenchmarkMutex is an uncontended
// sync.Mutex, for scale on the machine at hand.
func BenchmarkKey(b *testing.B) {
	z := rand.NewZipf(rand.New(rand.NewPCG(1, 1)), 1.05, 1, 100_000-1)
	zipf := make([]uint64, 1<<16)
	for i := range zipf {
		zipf[i] = z.Uint64()
	}
	turn := make([]uint64, 1000)
	for i := range turn {
		turn[i] = uint64(i)
	}
	buf := []byte("per-key|client-")
	prefix := len(buf)
	it := &engine.Item{Verdict: engine.Verdict{Decided: true}}
	it.Decision.Burst, it.Decision.Tokens = 10, 5
	build := func(n uint64) {
		buf = strconv.AppendUint(buf[:prefix], n, 10)
		it.Key = unsafe.String(&buf[0], len(buf)) // the tracker copies what it keeps
	}
	for _, w := range []struct {
		name string
		seq  []uint64
	}{{"zipf", zipf}, {"1000-in-turn", turn}} {
		tr := topkeys.New()
		for _, n := range w.seq {
			build(n)
			tr.Key("per-key", rules.Enforce, engine.Allowed, it)
		}
		b.Run(w.name+"/build", func(b *testing.B) {
			start := cputime.Process()
			for i := range b.N {
				build(w.seq[i%len(w.seq)])
			}
			cputime.Report(b, start)
		})
		b.Run(w.name+"/build+key", func(b *testing.B) {
			b.ReportAllocs()
			start := cputime.Process()
			for i := range b.N {
				build(w.seq[i%len(w.seq)])
				tr.Key("per-key", rules.Enforce, engine.Allowed, it)
			}
			cputime.Report(b, start)
		})
	}
}

var sink int

func BenchmarkMutex(b *testing.B) {
	var mu sync.Mutex
	start := cputime.Process()
	for range b.N {
		mu.Lock()
		sink++
		mu.Unlock()
	}
	cputime.Report(b, start)
}
