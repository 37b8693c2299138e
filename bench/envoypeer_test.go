package bench

// drip's Envoy rate limit service beside envoyproxy/ratelimit, both on one
// redis-server started for the run, driven by one gRPC load generator in
// this process:
//
//	cd bench && go test -run '^$' -bench 'EnvoyPeer' -benchtime 1x -v
//
// The peer is built from its Go module (its src/service, src/redis and
// src/config packages, as its runner puts them together, with its default
// settings: a pool of 10 connections, no local cache, stats to a null
// sink) and serves on a gRPC listener of its own; drip is drip serve's
// gRPC listener on redisstore as it comes (batching on). Both read the
// same configuration (envoyBenchConfig: a million a second, so every call
// is allowed and writes).
//
// Three workloads: one descriptor over 100,000 client addresses, one
// descriptor on one hot address, and two descriptors per call (the
// address and a path nested under it) over 100,000 addresses, each a
// sub-benchmark of envoyRoundCount rounds of both services, alternating
// which goes first, each phase envoyPhase long with 64 calls in flight on one connection
// (each the next as soon as the last returns), under a deadline of five
// seconds (so that both do all their work on a loaded machine; calls over
// Envoy's default 20 ms are counted, and any over the deadline).
// drip's store deadline is the calls' (the peer has none but its
// client's 10 s): the default 1 s, with the breaker behind it, failed
// two-descriptor calls on this loaded machine.
// DRIP_BENCH_ENVOY_ONLY=drip (or envoyproxy-ratelimit) runs one service,
// for a profile. Reported per service: the median over the rounds of
// calls/s, p50 and p99 latency, and the CPU per call of this process
// (client and both services) plus redis-server's (INFO cpu); and the
// medians of the rounds' own ratios, drip against the peer.

import (
	"context"
	"fmt"
	"net"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/driplimit/drip/bench/envoypeer"
	"github.com/driplimit/drip/store/redisstore"
)

const (
	envoyPeerKeys    = 100_000
	envoyPeerStreams = 64
	envoyPhase       = 3 * time.Second
	envoyRoundCount  = 5
	envoyDeadline    = 5 * time.Second
)

// startEnvoyPeer serves envoyproxy/ratelimit's service on loopback port 0
// over the Redis at url until the benchmark ends, and returns a client.
func startEnvoyPeer(b *testing.B, url string) *grpc.ClientConn {
	return startEnvoyPeerWith(b, url, envoyBenchConfig)
}

// startEnvoyPeerWith is startEnvoyPeer reading the configuration yaml.
func startEnvoyPeerWith(b *testing.B, url, yaml string) *grpc.ClientConn {
	return startPeer(b, envoypeer.Config{Redis: strings.TrimPrefix(url, "redis://"), Name: "edge.yaml", YAML: yaml, Prefix: "bench:rl:"})
}

// startPeer serves the peer c sets up on loopback port 0 until the
// benchmark ends, and returns a client.
func startPeer(b *testing.B, c envoypeer.Config) *grpc.ClientConn {
	b.Helper()
	gs, closeRedis := envoypeer.NewServer(c)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	go gs.Serve(ln)
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { conn.Close(); gs.Stop(); closeRedis() })
	return conn
}

// envoyPhaseResult is one service's phase of one workload.
type envoyPhaseResult struct {
	perSec, p50, p99, cpu, redisCPU float64 // calls/s, µs, µs, µs per call, µs per call
	over20ms, late                  int64
}

// envoyPhaseRun sends calls from envoyPeerStreams streams for envoyPhase.
func envoyPhaseRun(b *testing.B, url string, client rlsv3.RateLimitServiceClient, reqs []*rlsv3.RateLimitRequest) envoyPhaseResult {
	var n atomic.Int64
	var slow, late atomic.Int64
	var failed atomic.Pointer[error]
	lat := make([][]time.Duration, envoyPeerStreams)
	var wg sync.WaitGroup
	rcpu := redisCPU(b, url)
	cpu := processCPU()
	start := time.Now()
	deadline := start.Add(envoyPhase)
	for w := range envoyPeerStreams {
		wg.Go(func() {
			mine := make([]time.Duration, 0, 4096)
			for i := w * 7919; time.Now().Before(deadline); i += 104729 {
				t0 := time.Now()
				ctx, cancel := context.WithTimeout(context.Background(), envoyDeadline)
				resp, err := client.ShouldRateLimit(ctx, reqs[i%len(reqs)])
				cancel()
				d := time.Since(t0)
				if status.Code(err) == codes.DeadlineExceeded {
					late.Add(1) // counted, and its latency kept
					err = nil
					resp = &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK}
				}
				if err == nil && resp.OverallCode != rlsv3.RateLimitResponse_OK {
					err = fmt.Errorf("%v", resp.OverallCode)
				}
				if err != nil {
					failed.CompareAndSwap(nil, &err)
					return
				}
				mine = append(mine, d)
				if d > 20*time.Millisecond {
					slow.Add(1)
				}
				n.Add(1)
			}
			lat[w] = mine
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	used := processCPU() - cpu
	rused := redisCPU(b, url) - rcpu
	if err := failed.Load(); err != nil {
		b.Fatal(*err)
	}
	all := slices.Concat(lat...)
	slices.Sort(all)
	calls := float64(n.Load())
	return envoyPhaseResult{
		perSec: calls / elapsed.Seconds(), p50: pct(all, 0.5), p99: pct(all, 0.99),
		cpu: used.Seconds() * 1e6 / calls, redisCPU: rused * 1e6 / calls, over20ms: slow.Load(), late: late.Load(),
	}
}

func BenchmarkEnvoyPeer(b *testing.B) {
	url := redisURL(b)
	redisClean(b, url)
	s, err := redisstore.Open(url, redisstore.WithPrefix("bench:drip:"))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { s.Close() })
	services := []envoyService{
		{"drip", rlsv3.NewRateLimitServiceClient(startEnvoyStore(b, s, envoyDeadline))},
		{"envoyproxy-ratelimit", rlsv3.NewRateLimitServiceClient(startEnvoyPeer(b, url))},
	}
	if only := os.Getenv("DRIP_BENCH_ENVOY_ONLY"); only != "" {
		services = slices.DeleteFunc(services, func(s envoyService) bool { return s.name != only })
	}
	workloads := []struct {
		name string
		reqs []*rlsv3.RateLimitRequest
	}{
		{"100k-keys", envoyRequestsOver(envoyPeerKeys, 1)},
		{"hot-key", envoyRequestsOver(1, 1)},
		{"2-descriptors", envoyRequestsOver(envoyPeerKeys, 2)},
	}
	for _, svc := range services { // warm the connections and the pools
		for _, r := range workloads[0].reqs[:500] {
			if _, err := svc.client.ShouldRateLimit(context.Background(), r); err != nil {
				b.Fatal(err)
			}
		}
	}
	for _, w := range workloads {
		b.Run(w.name, func(b *testing.B) {
			for range b.N {
				envoyRounds(b, url, services, w.reqs)
			}
			b.ReportMetric(0, "ns/op")
		})
	}
}

type envoyService struct {
	name   string
	client rlsv3.RateLimitServiceClient
}

// envoyRounds runs envoyRoundCount rounds of reqs on each service,
// alternating which goes first, and reports the medians.
func envoyRounds(b *testing.B, url string, services []envoyService, reqs []*rlsv3.RateLimitRequest) {
	res := make([][]envoyPhaseResult, len(services))
	for r := range envoyRoundCount {
		for k := range services {
			i := k
			if r%2 == 1 {
				i = len(services) - 1 - k
			}
			p := envoyPhaseRun(b, url, services[i].client, reqs)
			res[i] = append(res[i], p)
			b.Logf("round %d %s: %.0f calls/s, p50 %.0f µs, p99 %.0f µs, cpu %.1f + redis %.1f µs/call, over 20 ms %d, over the deadline %d",
				r, services[i].name, p.perSec, p.p50, p.p99, p.cpu, p.redisCPU, p.over20ms, p.late)
		}
	}
	med := func(x []float64) float64 { slices.Sort(x); return x[len(x)/2] }
	each := func(rs []envoyPhaseResult, f func(envoyPhaseResult) float64) []float64 {
		x := make([]float64, len(rs))
		for i, p := range rs {
			x[i] = f(p)
		}
		return x
	}
	perSec := func(p envoyPhaseResult) float64 { return p.perSec }
	p50 := func(p envoyPhaseResult) float64 { return p.p50 }
	p99 := func(p envoyPhaseResult) float64 { return p.p99 }
	cpu := func(p envoyPhaseResult) float64 { return p.cpu + p.redisCPU }
	for i, svc := range services {
		b.ReportMetric(med(each(res[i], perSec)), svc.name+"-calls/s")
		b.ReportMetric(med(each(res[i], p50)), svc.name+"-p50-µs")
		b.ReportMetric(med(each(res[i], p99)), svc.name+"-p99-µs")
		b.ReportMetric(med(each(res[i], cpu)), svc.name+"-cpu-µs/call")
		b.ReportMetric(med(each(res[i], func(p envoyPhaseResult) float64 { return p.redisCPU })), svc.name+"-redis-cpu-µs/call")
	}
	if len(services) != 2 {
		return
	}
	// The rounds' own ratios, drip (0) against the peer (1): throughput,
	// and the peer's p50 and CPU per call over drip's.
	ratio := func(f func(envoyPhaseResult) float64, inverse bool) float64 {
		x := make([]float64, len(res[0]))
		for i := range x {
			x[i] = f(res[0][i]) / f(res[1][i])
			if inverse {
				x[i] = 1 / x[i]
			}
		}
		return med(x)
	}
	b.ReportMetric(ratio(perSec, false), "drip/peer-calls/s")
	b.ReportMetric(ratio(p50, true), "peer/drip-p50")
	b.ReportMetric(ratio(cpu, true), "peer/drip-cpu")
}
