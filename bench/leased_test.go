package bench

// Leased tokens (store/leased) beside per-decision takes, on one
// redis-server started for the run, and on PostgreSQL
// (BenchmarkLeasedPostgres): 4 instances (each its own connection
// and, leased, its own blocks) share it, 64 callers spread over them.
//
//	cd bench && go test -run '^$' -bench 'Leased' -benchtime 2s -count 3
//
// Workloads: one hot key (a limit of 100 million a second, burst 10
// million, so that every take is granted and neither mode is held back by
// the limit: at a million a second, as before, the leased instances
// reached the limit's own rate, emptied the bucket and fell back to
// per-decision takes), the same key saturated (a limit of 200 a second,
// its burst taken before the timer starts: nearly every take is denied),
// and 10,000 keys taken uniformly (each key then sees about one
// take per 10,000: demand per key is too thin for blocks).
// Metrics: decisions/s, store calls per decision, the share granted, and
// the CPU each decision cost this process (cpu-ns/op: callers, instances,
// client) and the server (server-cpu-µs). On a machine shared with other
// jobs decisions/s follow the share of the CPU each side gets; the CPU per
// decision does not.
//
// BenchmarkLeasedLocal is the leased instance's own cost: one key on the
// memory store, leased there (leased.LeaseInProcess), every take but a
// few granted from a block.

import (
	"context"
	"fmt"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/driplimit/drip"
	"github.com/driplimit/drip/bucket"
	"github.com/driplimit/drip/internal/testkit/testserver"
	"github.com/driplimit/drip/store"
	"github.com/driplimit/drip/store/leased"
	"github.com/driplimit/drip/store/memstore"
	"github.com/driplimit/drip/store/pgstore"
	"github.com/driplimit/drip/store/redisstore"
)

func BenchmarkLeased(b *testing.B) {
	url := redisURL(b)
	benchLeased(b, func(b *testing.B) string {
		redisClean(b, url)
		return "k"
	}, func(b *testing.B) float64 { return redisCPU(b, url) }, func(b *testing.B) store.Store {
		rs, err := redisstore.Open(url, redisstore.WithPrefix("bench:"))
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { rs.Close() })
		return rs
	})
}

// BenchmarkLeasedPostgres is BenchmarkLeased on the PostgreSQL server of
// the PostgreSQL benchmarks (pg_test.go), each instance a pgstore of its
// own (batching on, the default), each run on keys of its own:
//
//	cd bench && go test -run '^$' -bench 'LeasedPostgres' -benchtime 2s -count 3
func BenchmarkLeasedPostgres(b *testing.B) {
	url := pgURL(b)
	db := pgPool(b, url, 1, "")
	if err := pgstore.Install(context.Background(), db, pgstore.InstallOptions{}); err != nil {
		b.Fatal(err)
	}
	var run atomic.Int64
	benchLeased(b, func(*testing.B) string {
		return fmt.Sprint("leased", time.Now().UnixNano(), ".", run.Add(1), ":k")
	}, nil, func(b *testing.B) store.Store {
		st, err := pgstore.Open(context.Background(), url, pgstore.WithSweep(0))
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { st.Close() })
		return st
	})
}

// BenchmarkLeasedPgBouncer is BenchmarkLeasedPostgres through a PgBouncer
// in transaction mode (4 server connections, testserver's default) in
// front of the same PostgreSQL server, started for the benchmark:
//
//	cd bench && go test -run '^$' -bench 'LeasedPgBouncer' -benchtime 2s -count 3
//
// It needs the server pgURL starts (not DRIP_BENCH_POSTGRES_URL).
func BenchmarkLeasedPgBouncer(b *testing.B) { benchLeasedPgBouncer(b, "leasedpgb", 0) }

// benchLeasedPgBouncer is BenchmarkLeasedPgBouncer with the pooler delay
// away each way (0: none), on keys whose names begin with name.
func benchLeasedPgBouncer(b *testing.B, name string, delay time.Duration) {
	url := pgURL(b)
	if pgServer.srv == nil {
		b.Skip("DRIP_BENCH_POSTGRES_URL: no server of the benchmark's own to put PgBouncer in front of")
	}
	if err := pgstore.Install(context.Background(), pgPool(b, url, 1, ""), pgstore.InstallOptions{}); err != nil {
		b.Fatal(err)
	}
	pb, err := testserver.NewPgBouncer(pgServer.srv, 0)
	if err != nil {
		b.Skipf("no PgBouncer: %v", err)
	}
	b.Cleanup(pb.Stop)
	pooler := pb.URL()
	if delay > 0 {
		pooler = farURL(b, pooler, delay)
	}
	var run atomic.Int64
	benchLeased(b, func(*testing.B) string {
		return fmt.Sprint(name, time.Now().UnixNano(), ".", run.Add(1), ":k")
	}, nil, func(b *testing.B) store.Store {
		st, err := pgstore.Open(context.Background(), pooler, pgstore.WithSweep(0))
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { st.Close() })
		return st
	})
}

// BenchmarkLeasedCluster is BenchmarkLeased on a Redis Cluster of three
// masters without replicas, started for the benchmark (the store does not
// batch on a cluster, plain and leased alike); the server CPU is the
// three masters' together:
//
//	cd bench && go test -run '^$' -bench 'LeasedCluster' -benchtime 2s -count 3
func BenchmarkLeasedCluster(b *testing.B) {
	if err := testserver.RedisMissing(); err != nil {
		b.Skipf("no Redis: %v", err)
	}
	c, err := testserver.LaunchRedisCluster(b.TempDir(), 3, 0)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(c.Stop)
	var run atomic.Int64
	benchLeased(b, func(*testing.B) string {
		return fmt.Sprint("leased", time.Now().UnixNano(), ".", run.Add(1), ":k")
	}, func(b *testing.B) float64 {
		var sum float64
		for _, n := range c.Nodes {
			sum += redisCPU(b, n.URL())
		}
		return sum
	}, func(b *testing.B) store.Store {
		rs, err := redisstore.Open(c.URL(), redisstore.WithPrefix("bench:"))
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { rs.Close() })
		return rs
	})
}

// BenchmarkLeasedMemory is BenchmarkLeased on one memory store that the 4
// instances share: what a library user wrapping the memory store gets
// (the wrapper passes every call to an in-process store as it is: its
// cost is that of the call through it).
//
//	cd bench && go test -run '^$' -bench 'LeasedMemory' -benchtime 2s -count 3
func BenchmarkLeasedMemory(b *testing.B) {
	var ms *memstore.Store
	benchLeased(b, func(b *testing.B) string {
		ms = memstore.New()
		b.Cleanup(func() { ms.Close() })
		return "k"
	}, nil, func(*testing.B) store.Store { return ms })
}

// benchLeased runs the workloads on 4 instances from open, on keys whose
// names begin with what fresh returns (called once a run); serverCPU (nil:
// none reported) reads the server's CPU seconds.
func benchLeased(b *testing.B, fresh func(*testing.B) string, serverCPU func(*testing.B) float64, open func(*testing.B) store.Store) {
	high := drip.PerSecond(100_000_000).WithBurst(10_000_000)
	for _, w := range []struct {
		name  string
		keys  int
		lim   drip.Limit
		drain bool
	}{{"keys=1", 1, high, false}, {"keys=1,saturated", 1, drip.PerSecond(200), true}, {"keys=10000", 10_000, high, false}} {
		keys, lim := w.keys, w.lim
		for _, mode := range []string{"per-decision", "leased"} {
			b.Run(w.name+"/"+mode, func(b *testing.B) {
				prefix := fresh(b)
				const instances, callers = 4, 64
				sts := make([]store.Store, instances)
				var raw store.Store // an instance's store, unwrapped
				var ls []*leased.Store
				for i := range sts {
					sts[i] = open(b)
					raw = sts[i]
					if mode == "leased" {
						l, err := leased.New(sts[i])
						if err != nil {
							b.Fatal(err)
						}
						b.Cleanup(func() { l.Close() })
						ls = append(ls, l)
						sts[i] = l
					}
				}
				items := make([]bucket.Prepared, keys)
				for k := range items {
					key := fmt.Sprint(prefix, k)
					p, err := lim.Params(key)
					if err != nil {
						b.Fatal(err)
					}
					if err := store.Prepare(&items[k], bucket.Take, key, &p, 1, false, ""); err != nil {
						b.Fatal(err)
					}
				}
				if w.drain {
					// The bucket emptied before the timer starts: the run
					// measures the saturated key, not its burst's drain.
					// The burst in one take first: on a busy machine a
					// take at a time may come no faster than the limit.
					// Then takes until one leaves the bucket short of the
					// next: waiting for a denial, a take at a time through
					// PgBouncer at 5 ms or more a round trip took the
					// token refilled meanwhile, every time, for minutes.
					whole := items[0]
					whole.Cost = whole.Params.Burst
					res := make([]bucket.Result, 1)
					if err := raw.Apply(context.Background(), bucket.Take, time.Time{}, []bucket.Prepared{whole}, res); err != nil {
						b.Fatal(err)
					}
					for res[0].Tokens >= items[0].Cost {
						if err := raw.Apply(context.Background(), bucket.Take, time.Time{}, items[:1], res); err != nil {
							b.Fatal(err)
						}
					}
				}
				var next, granted atomic.Int64
				b.SetParallelism(max(1, callers/runtime.GOMAXPROCS(0)))
				var server float64
				if serverCPU != nil {
					server = serverCPU(b)
				}
				b.ResetTimer()
				cpu := reportCPU(b)
				b.RunParallel(func(pb *testing.PB) {
					n := next.Add(1)
					st := sts[n%instances]
					res := make([]bucket.Result, 1)
					i := int(n * 7919)
					for pb.Next() {
						i++
						if err := st.Apply(context.Background(), bucket.Take, time.Time{}, items[i%keys:i%keys+1], res); err != nil {
							b.Error(err)
							return
						}
						if res[0].Allowed {
							granted.Add(1)
						}
					}
				})
				b.StopTimer()
				cpu()
				if serverCPU != nil {
					b.ReportMetric((serverCPU(b)-server)*1e6/float64(b.N), "server-cpu-µs")
				}
				b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "decisions/s")
				b.ReportMetric(float64(granted.Load())/float64(b.N), "granted")
				calls := int64(b.N)
				if ls != nil {
					calls = 0
					for _, l := range ls {
						calls += l.Stats().StoreCalls
					}
				}
				b.ReportMetric(float64(calls)/float64(b.N), "calls/decision")
			})
		}
	}
}

func BenchmarkLeasedLocal(b *testing.B) {
	ms := memstore.New()
	defer ms.Close()
	l, err := leased.New(ms, leased.LeaseInProcess()) // the blocks, not the pass-through
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	// A limit no caller exhausts: every take but the first few and those
	// that meet a block's end is granted locally.
	lim := drip.PerSecond(1_000_000_000).WithBurst(100_000_000)
	p, err := lim.Params("k")
	if err != nil {
		b.Fatal(err)
	}
	items := make([]bucket.Prepared, 1)
	if err := store.Prepare(&items[0], bucket.Take, "k", &p, 1, false, ""); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.SetParallelism(32)
	cpu := reportCPU(b)
	b.RunParallel(func(pb *testing.PB) {
		res := make([]bucket.Result, 1)
		for pb.Next() {
			if err := l.Apply(context.Background(), bucket.Take, time.Time{}, items, res); err != nil {
				b.Error(err)
				return
			}
		}
	})
	cpu()
	st := l.Stats()
	b.ReportMetric(float64(st.Local)/float64(max(1, st.Decisions)), "local")
}
