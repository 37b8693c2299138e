package bench

// drip serve, measured in one process and one run, so that the ratios in
// BENCHMARKS.md compare like with like:
//
//	cd bench && go test -run '^$' -bench 'Serve' -benchtime 20000x -count 3
//
// BenchmarkServeDecisionAPI: POST /v1/take with an inline limit on the
// memory store, one client at a time (latency p50/p99) beside the same
// decision made in-process (store.Apply), and many clients at once
// (throughput).
//
// BenchmarkServeGateway: the gateway's added latency: each iteration sends
// one request straight to the upstream and one through the gateway (in
// alternating order, over kept-alive connections), and the difference of
// their percentiles is what drip adds. The gateway applies an enforce
// per-IP rule and a shadow global rule (the shape of the built-in rules,
// with limits high enough that every request is allowed, the common case).

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/driplimit/drip"
	"github.com/driplimit/drip/bucket"
	"github.com/driplimit/drip/server"
	"github.com/driplimit/drip/store"
	"github.com/driplimit/drip/store/memstore"
)

const serveKeys = 10_000

// serveBodies are decision API bodies over serveKeys keys, under a limit
// that always allows.
var serveBodies = func() [][]byte {
	b := make([][]byte, serveKeys)
	for i := range b {
		b[i] = fmt.Appendf(nil, `{"key": "user:%d", "limit": {"rate": 1000000, "burst": 1000000}}`, i)
	}
	return b
}()

// startServe runs a server on loopback port 0 until the benchmark ends.
func startServe(b *testing.B, cfg server.Config, store store.Store) string {
	b.Helper()
	cfg.Listen = "127.0.0.1:0"
	cfg.AdminListen = "off"
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	s, err := server.New(cfg, store)
	if err != nil {
		b.Fatal(err)
	}
	if err := s.Listen(); err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { s.Serve(ctx); close(done) }()
	b.Cleanup(func() { cancel(); <-done })
	return "http://" + s.Addr().String()
}

func benchClient() *http.Client {
	return &http.Client{Transport: &http.Transport{MaxIdleConns: 512, MaxIdleConnsPerHost: 512, Proxy: nil}}
}

// do sends one request and drains the answer, which must be a 200; it
// returns the latency.
func do(b *testing.B, c *http.Client, req *http.Request, body []byte) time.Duration {
	d, status, ans := send(b, c, req, body)
	if status != 200 {
		b.Fatalf("%s %s: %d %s", req.Method, req.URL, status, ans)
	}
	return d
}

// send sends one request (with body, unless nil) and reads the answer:
// the latency, the status and the answer's body.
func send(b *testing.B, c *http.Client, req *http.Request, body []byte) (time.Duration, int, []byte) {
	if body != nil {
		req.Body = io.NopCloser(bytes.NewReader(body))
		req.ContentLength = int64(len(body))
	}
	start := time.Now()
	resp, err := c.Do(req)
	if err != nil {
		b.Fatal(err)
	}
	ans, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	d := time.Since(start)
	if err != nil {
		b.Fatalf("%s %s: %v", req.Method, req.URL, err)
	}
	return d, resp.StatusCode, ans
}

// pct is the p-th percentile of sorted latencies, in microseconds.
func pct(sorted []time.Duration, p float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	i := min(len(sorted)-1, int(p*float64(len(sorted))))
	return float64(sorted[i]) / float64(time.Microsecond)
}

func BenchmarkServeDecisionAPI(b *testing.B) {
	store := memstore.New()
	base := startServe(b, server.Config{}, store)
	c := benchClient()

	b.Run("latency", func(b *testing.B) {
		api := make([]time.Duration, 0, b.N)
		local := make([]time.Duration, 0, b.N)
		lim := drip.Limit{Rate: 1e6, Burst: 1e6}
		for i := 0; b.Loop(); i++ {
			req, _ := http.NewRequest("POST", base+"/v1/take", nil)
			api = append(api, do(b, c, req, serveBodies[i%serveKeys]))
			start := time.Now()
			if _, err := drip.Apply(context.Background(), store, bucket.Take, time.Time{}, drip.Request{Key: fmt.Sprint("local:", i%serveKeys), Limit: lim, Cost: 1}); err != nil {
				b.Fatal(err)
			}
			local = append(local, time.Since(start))
		}
		slices.Sort(api)
		slices.Sort(local)
		b.ReportMetric(pct(api, 0.5), "api-p50-µs")
		b.ReportMetric(pct(api, 0.99), "api-p99-µs")
		b.ReportMetric(pct(local, 0.5), "inproc-p50-µs")
		b.ReportMetric(pct(api, 0.5)/max(pct(local, 0.5), 1e-3), "api/inproc-p50")
		b.ReportMetric(0, "ns/op")
	})

	b.Run("throughput", func(b *testing.B) {
		var n atomic.Int64
		b.SetParallelism(16) // 16 clients per GOMAXPROCS
		start := time.Now()
		b.RunParallel(func(pb *testing.PB) {
			i := int(n.Add(1)) * 7919
			for pb.Next() {
				req, _ := http.NewRequest("POST", base+"/v1/take", nil)
				do(b, c, req, serveBodies[i%serveKeys])
				i++
			}
		})
		b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "decisions/s")
	})
}

func BenchmarkServeGateway(b *testing.B) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain")
		w.Write([]byte("hello from upstream\n"))
	}))
	b.Cleanup(up.Close)
	rules := filepath.Join(b.TempDir(), "rules.json")
	if err := os.WriteFile(rules, []byte(`{"rules": [
	  {"name": "per-ip", "limit_keys": ["ip:address"], "algorithm_config": {"rps": 1000000, "burst": 1000000}},
	  {"name": "global", "limit_keys": ["global"], "mode": "shadow", "algorithm_config": {"rps": 1000000, "burst": 1000000}}
	]}`), 0o644); err != nil {
		b.Fatal(err)
	}
	gw := startServe(b, server.Config{Upstream: up.URL, Rules: rules, WatchEvery: -1}, memstore.New())
	c := benchClient()
	direct := make([]time.Duration, 0, b.N)
	via := make([]time.Duration, 0, b.N)
	dreq, _ := http.NewRequest("GET", up.URL+"/hello", nil)
	greq, _ := http.NewRequest("GET", gw+"/hello", nil)
	for range 200 { // warm both paths' connections
		do(b, c, dreq, nil)
		do(b, c, greq, nil)
	}
	for i := 0; b.Loop(); i++ {
		if i%2 == 0 {
			direct = append(direct, do(b, c, dreq, nil))
			via = append(via, do(b, c, greq, nil))
		} else {
			via = append(via, do(b, c, greq, nil))
			direct = append(direct, do(b, c, dreq, nil))
		}
	}
	slices.Sort(direct)
	slices.Sort(via)
	b.ReportMetric(pct(direct, 0.5), "direct-p50-µs")
	b.ReportMetric(pct(via, 0.5), "gateway-p50-µs")
	b.ReportMetric(pct(via, 0.5)-pct(direct, 0.5), "added-p50-µs")
	b.ReportMetric(pct(via, 0.99)-pct(direct, 0.99), "added-p99-µs")
	b.ReportMetric(pct(via, 0.5)/pct(direct, 0.5), "gateway/direct-p50")
	b.ReportMetric(pct(via, 0.99)/pct(direct, 0.99), "gateway/direct-p99")
	b.ReportMetric(0, "ns/op")
}

// BenchmarkServeVsTrivial: the decision API beside a trivial Go JSON
// server (it reads the body and answers a fixed decision) under the same
// load: 64 clients over kept-alive connections, 100,000 keys, inline
// limits that always allow, on the memory store. Rounds alternate which
// server goes first; each phase lasts servePhase. It reports each
// server's median requests/s and the median of the rounds' ratios, and
// the process's CPU time per request (clients and server together, the
// figure the machine's other work disturbs least) with its ratio.
//
//	cd bench && go test -run '^$' -bench ServeVsTrivial -benchtime 1x
func BenchmarkServeVsTrivial(b *testing.B) {
	const clients, keys, rounds, servePhase = 64, 100_000, 6, 2 * time.Second
	bodies := make([][]byte, keys)
	for i := range bodies {
		bodies[i] = fmt.Appendf(nil, `{"key": "user:%d", "limit": {"rate": 1000000, "burst": 1000000}}`, i)
	}
	api := startServe(b, server.Config{}, memstore.New()) + "/v1/take"
	fixed := []byte(`{"allowed":true,"tokens":999999,"remaining":999999,"limit":1000000,"retry_after":0,"reset_after":0.000001}` + "\n")
	triv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		w.Write(fixed)
	}))
	b.Cleanup(triv.Close)
	c := benchClient()
	phase := func(url string) (perSec, cpuPer float64) {
		var n atomic.Int64
		deadline := time.Now().Add(servePhase)
		start, cpu := time.Now(), processCPU()
		done := make(chan struct{})
		for g := range clients {
			go func() {
				defer func() { done <- struct{}{} }()
				for i := g * 7919; time.Now().Before(deadline); i++ {
					req, _ := http.NewRequest("POST", url, nil)
					do(b, c, req, bodies[i%keys])
					n.Add(1)
				}
			}()
		}
		for range clients {
			<-done
		}
		return float64(n.Load()) / time.Since(start).Seconds(), float64(processCPU()-cpu) / 1e3 / float64(n.Load())
	}
	phase(api) // warm: connections made, every key held
	phase(triv.URL)
	for range b.N {
		var a, t, ratio, ac, tc, cratio []float64
		for r := range rounds {
			var ra, rt, ca, ct float64
			if r%2 == 0 {
				rt, ct = phase(triv.URL)
				ra, ca = phase(api)
			} else {
				ra, ca = phase(api)
				rt, ct = phase(triv.URL)
			}
			a, t, ratio = append(a, ra), append(t, rt), append(ratio, ra/rt)
			ac, tc, cratio = append(ac, ca), append(tc, ct), append(cratio, ct/ca)
			b.Logf("round %d: decision API %.0f/s %.1f cpu-µs/req, trivial %.0f/s %.1f cpu-µs/req; ratio %.2f, by CPU %.2f", r, ra, ca, rt, ct, ra/rt, ct/ca)
		}
		med := func(x []float64) float64 { slices.Sort(x); return x[len(x)/2] }
		b.ReportMetric(med(a), "api-req/s")
		b.ReportMetric(med(t), "trivial-req/s")
		b.ReportMetric(med(ratio), "api/trivial")
		b.ReportMetric(med(ac), "api-cpu-µs/req")
		b.ReportMetric(med(tc), "trivial-cpu-µs/req")
		b.ReportMetric(med(cratio), "trivial/api-cpu")
		b.ReportMetric(0, "ns/op")
	}
}
