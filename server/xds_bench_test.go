package server

import (
	"os"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"testing"
	"time"

	rlconfv3 "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"

	"github.com/driplimit/drip/internal/cputime"
	"github.com/driplimit/drip/server/envoy/xds"
	"github.com/driplimit/drip/server/envoy/xds/xdstest"
	"github.com/driplimit/drip/store/memstore"
)

// routes is a snapshot of n route descriptors of domain, valued
// prefix0, prefix1, ...: what a control plane sends for n routes.
func routes(domain, prefix string, n int) *rlconfv3.RateLimitConfig {
	descs := make([]*rlconfv3.RateLimitDescriptor, n)
	for i := range descs {
		descs[i] = xdstest.Limit("route", prefix+strconv.Itoa(i), 10, rlconfv3.RateLimitUnit_SECOND)
	}
	return xdstest.Config(domain, domain, descs...)
}

// churn serves from an xDS server and pushes, once per b.N, a snapshot of
// n descriptors none of which were in force before, each applied (ACKed)
// before the next; first, untimed, one of first descriptors (0: none).
func churn(b *testing.B, first, n int) *running {
	srv := xdstest.Start(b, nil)
	r := start(b, Config{XDSForceStart: true, XDS: &xds.Config{Server: srv.Addr, NodeID: "n",
		Backoff: xds.Backoff{Initial: 10 * time.Millisecond, Max: 50 * time.Millisecond}}}, memstore.New())
	push := func(v string, snap *rlconfv3.RateLimitConfig) {
		srv.Push(b, "n", v, snap)
		// Polled, with a deadline far past xdstest.Wait: a large snapshot
		// on a loaded machine may take minutes.
		for deadline := time.Now().Add(10 * time.Minute); !srv.Acked(v); time.Sleep(5 * time.Millisecond) {
			if time.Now().After(deadline) {
				b.Fatalf("version %s not applied within 10 minutes", v)
			}
		}
	}
	if first > 0 {
		push("first", routes("d", "first-", first))
	}
	b.ResetTimer()
	var cpu time.Duration
	for i := range b.N {
		b.StopTimer()
		snap := routes("d", "s"+strconv.Itoa(i)+"-", n) // made here: b.N of them at once would be most of the heap
		b.StartTimer()
		start := cputime.Process()
		push(strconv.Itoa(i+1), snap)
		cpu += cputime.Process() - start
	}
	b.StopTimer()
	b.ReportMetric(float64(cpu)/float64(b.N), "cpu-ns/op")
	return r
}

// BenchmarkXDSApply: the time from a snapshot of n fresh descriptors
// pushed to its ACK (the client's conversion, the parse, the swap and
// the metrics' update), each after the one before; cpu-ns/op counts the
// whole process (the test's xDS server too).
func BenchmarkXDSApply(b *testing.B) {
	for _, n := range []int{10_000, 50_000, 170_000} {
		b.Run("descriptors="+strconv.Itoa(n), func(b *testing.B) { churn(b, 0, n) })
	}
	// As reported: 170,000 after 100,000 others.
	b.Run("descriptors=170000-after-100000", func(b *testing.B) { churn(b, 100_000, 170_000) })
}

// BenchmarkXDSChurn: b.N snapshots of 10,000 fresh descriptors, and
// what the process holds after the last: its live heap after a
// collection, /metrics' size, its resident memory (and its peak).
// Run it with -benchtime 100x, and with 1x for a fresh process on the
// last configuration.
func BenchmarkXDSChurn(b *testing.B) {
	r := churn(b, 0, 10_000)
	runtime.GC()
	debug.FreeOSMemory()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	b.ReportMetric(float64(ms.HeapAlloc)/(1<<20), "heap-MB")
	code, page := call(b, "GET", r.admin+"/metrics", "")
	if code != 200 {
		b.Fatalf("/metrics: %d", code)
	}
	b.ReportMetric(float64(len(page))/(1<<20), "metrics-MB")
	b.ReportMetric(float64(strings.Count(page, "\n")), "metrics-lines")
	if st, err := os.ReadFile("/proc/self/status"); err == nil {
		for _, line := range strings.Split(string(st), "\n") {
			f := strings.Fields(line)
			if len(f) == 3 && (f[0] == "VmRSS:" || f[0] == "VmHWM:") {
				kb, _ := strconv.ParseFloat(f[1], 64)
				b.ReportMetric(kb/1024, map[string]string{"VmRSS:": "rss-MB", "VmHWM:": "peak-rss-MB"}[f[0]])
			}
		}
	}
}
