package bench

// Leased tokens through drip serve: 4 servers in this process, each the
// decision API over a store connection of its own (a pgstore or a
// redisstore each, batching on, the default), wrapped by the leased
// store as --leased wraps it ("leased") or not ("plain"); 48 clients over
// kept-alive connections, spread over the 4, send POST /v1/take on one
// hot key with an inline limit for servePhaseLeased each. The memory
// store ("memory", one store under the 4 servers) is the ceiling: the
// servers' own HTTP cost with a store that costs nothing.
//
//	cd bench && go test -run '^$' -bench 'ServeLeased' -benchtime 1x
//
// Workloads: a limit that grants every take (100 million a second,
// burst 10 million), and one of 200 a second (burst 200), which the
// clients exhaust at once: its bucket is empty nearly all the run.
// Metrics: decisions/s, p50 and p99 of a request, the share granted,
// the errors (503s: the store missed drip serve's 1 s deadline), the CPU
// a request cost this process (clients and servers: cpu-µs/decision)
// and the Redis server (server-cpu-µs/decision), the decisions a second
// of both CPUs together made (decisions/cpu-s), the commands the Redis
// server ran a request (commands/decision: FCALL and the commands of
// its function), and for the leased runs the store calls per decision.
// On a machine shared with other jobs decisions/s follow the share of the
// CPU the process gets, and a run whose store is another process (Redis,
// PostgreSQL) gets that process's share too: compare decisions/cpu-s.
// runq-s/cpu-s is the time the process's threads waited for a CPU while
// runnable, a second of CPU they got (Linux): how much of the machine
// the other jobs kept from the process.

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/driplimit/drip/server"
	"github.com/driplimit/drip/store"
	"github.com/driplimit/drip/store/leased"
	"github.com/driplimit/drip/store/memstore"
	"github.com/driplimit/drip/store/pgstore"
	"github.com/driplimit/drip/store/redisstore"
)

const servePhaseLeased = 3 * time.Second

func BenchmarkServeLeased(b *testing.B) {
	type backend struct {
		name   string
		open   func(b *testing.B) store.Store // one instance's store
		shared bool                           // one store for the 4 instances
		cpu    func(b *testing.B) float64     // the server's CPU seconds (nil: not reported)
	}
	// One redis-server for the whole benchmark, which the 4 instances of
	// a run share (before, each instance started a server of its own).
	redisOnce := sync.OnceValue(func() string { return redisURL(b) })
	backends := []backend{
		{"memory", func(b *testing.B) store.Store { return memstore.New() }, true, nil},
		{"redis", func(b *testing.B) store.Store {
			rs, err := redisstore.Open(redisOnce(), redisstore.WithPrefix("bench:"))
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { rs.Close() })
			return rs
		}, false, func(b *testing.B) float64 { return redisCPU(b, redisOnce()) }},
		{"postgres", func(b *testing.B) store.Store {
			url := pgURL(b)
			if err := pgstore.Install(context.Background(), pgPool(b, url, 1, ""), pgstore.InstallOptions{}); err != nil {
				b.Fatal(err)
			}
			st, err := pgstore.Open(context.Background(), url, pgstore.WithSweep(0))
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { st.Close() })
			return st
		}, false, nil},
	}
	limits := []struct{ name, json string }{
		{"unsaturated", `{"rate": 100000000, "burst": 10000000}`},
		{"saturated 200/s", `{"rate": 200, "burst": 200}`},
	}
	for _, be := range backends {
		for _, lim := range limits {
			for _, mode := range []string{"plain", "leased"} {
				if be.shared && mode == "leased" {
					continue // the memory store is in the process already
				}
				b.Run(fmt.Sprintf("%s/%s/%s", be.name, lim.name, mode), func(b *testing.B) {
					const instances, clients = 4, 48
					var shared store.Store
					var ls []*leased.Store
					urls := make([]string, instances)
					for i := range urls {
						st := shared
						if st == nil {
							st = be.open(b)
						}
						if be.shared {
							shared = st
						}
						if mode == "leased" {
							l, err := leased.New(st)
							if err != nil {
								b.Fatal(err)
							}
							b.Cleanup(func() { l.Close() })
							ls = append(ls, l)
							st = l
						}
						// No drain at the end: 5 s a server, 20 s a run before.
						urls[i] = startServe(b, server.Config{Drain: -1}, st) + "/v1/take"
					}
					body := fmt.Appendf(nil, `{"key": "hot:%d", "limit": %s}`, time.Now().UnixNano(), lim.json)
					c := benchClient()
					for range b.N {
						var server float64
						var cmds int64
						if be.cpu != nil {
							server, cmds = be.cpu(b), redisCommands(b, redisOnce())
						}
						cpu, waited := processCPU(), runQueueWait()
						run := serveLoad(b, c, urls, clients, body)
						used := float64(processCPU()-cpu) / 1e9 // CPU seconds, this process's and the server's
						b.ReportMetric(float64(runQueueWait()-waited)/1e9/used, "runq-s/cpu-s")
						b.ReportMetric(used*1e6/run.n, "cpu-µs/decision")
						if be.cpu != nil {
							sv := be.cpu(b) - server
							used += sv
							b.ReportMetric(sv*1e6/run.n, "server-cpu-µs/decision")
							b.ReportMetric(float64(redisCommands(b, redisOnce())-cmds)/run.n, "commands/decision")
						}
						if be.cpu != nil || be.shared { // PostgreSQL's CPU is not read
							b.ReportMetric(run.n/used, "decisions/cpu-s")
						}
						b.ReportMetric(run.perSec, "decisions/s")
						b.ReportMetric(run.p50, "p50-µs")
						b.ReportMetric(run.p99, "p99-µs")
						b.ReportMetric(run.granted, "granted")
						b.ReportMetric(run.errors, "errors")
						if ls != nil {
							var calls, decisions int64
							for _, l := range ls {
								st := l.Stats()
								calls += st.StoreCalls
								decisions += st.Decisions
							}
							b.ReportMetric(float64(calls)/float64(max(1, decisions)), "calls/decision")
						}
						b.ReportMetric(0, "ns/op")
					}
				})
			}
		}
	}
}

// runQueueWait is the time the process's threads have waited for a CPU
// while runnable (the second field of each thread's schedstat, Linux
// only; 0 elsewhere), in ns. Threads that ended are not counted.
func runQueueWait() int64 {
	tasks, _ := os.ReadDir("/proc/self/task")
	var sum int64
	for _, t := range tasks {
		b, err := os.ReadFile("/proc/self/task/" + t.Name() + "/schedstat")
		if err != nil {
			continue
		}
		if f := strings.Fields(string(b)); len(f) >= 2 {
			n, _ := strconv.ParseInt(f[1], 10, 64)
			sum += n
		}
	}
	return sum
}

// serveRun is a load's result: decisions (200s) a second, their p50 and
// p99 in µs, the share granted, and the answers that were errors.
type serveRun struct{ perSec, p50, p99, granted, errors, n float64 }

// serveLoad sends body from clients goroutines, each to one of urls in
// turn, for servePhaseLeased.
func serveLoad(b *testing.B, c *http.Client, urls []string, clients int, body []byte) serveRun {
	var mu sync.Mutex
	var lat []time.Duration
	var granted, errors int
	var wg sync.WaitGroup
	start := time.Now()
	deadline := start.Add(servePhaseLeased)
	for g := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			own := make([]time.Duration, 0, 4096)
			ok, failed := 0, 0
			url := urls[g%len(urls)]
			for time.Now().Before(deadline) {
				req, _ := http.NewRequest("POST", url, nil)
				d, status, ans := send(b, c, req, body)
				switch {
				case status != 200:
					failed++ // the store missed its deadline: a 503
					continue
				case bytes.Contains(ans, []byte(`"allowed":true`)):
					ok++
				}
				own = append(own, d)
			}
			mu.Lock()
			lat = append(lat, own...)
			granted += ok
			errors += failed
			mu.Unlock()
		}()
	}
	wg.Wait()
	slices.Sort(lat)
	return serveRun{
		perSec:  float64(len(lat)) / time.Since(start).Seconds(),
		p50:     pct(lat, 0.5),
		p99:     pct(lat, 0.99),
		granted: float64(granted) / float64(max(1, len(lat))),
		errors:  float64(errors),
		n:       float64(max(1, len(lat)+errors)),
	}
}
