package bench

// One hot key over its limit, through Envoy's rate limit service: drip
// serve's gRPC listener on Redis with its local denials (the default) and
// without them (LOCAL_CACHE_SIZE_IN_BYTES=0), leased (--leased) with and
// without, drip on the memory store (the ceiling), and
// envoyproxy/ratelimit with its local cache on (LOCAL_CACHE_SIZE_IN_BYTES
// of 1 MiB, freecache), all on one redis-server started for the run:
//
//	cd bench && go test -run '^$' -bench 'EnvoyOverLimit' -benchtime 1x -v
//
// The limit is 10 calls a second on one address; 64 calls in flight on
// one connection, each the next as soon as the last returns, nearly all
// of them denied. Each service runs envoyRoundCount phases of
// envoyPhase, in turn (the order alternating); reported per service: the
// median calls/s and CPU per call (this process, client and services,
// plus redis-server's, from /proc and INFO cpu), and the Redis commands
// per call. DRIP_ENVOY_ALGORITHM=fixed_window counts in fixed windows,
// as envoyproxy/ratelimit does; DRIP_BENCH_METRICS=1 logs each drip
// serve's local denials and store calls at the end.

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/driplimit/drip/bench/envoypeer"
	"github.com/driplimit/drip/server"
	"github.com/driplimit/drip/store"
	"github.com/driplimit/drip/store/leased"
	"github.com/driplimit/drip/store/memstore"
	"github.com/driplimit/drip/store/redisstore"
)

const envoyOverConfig = `domain: over
descriptors:
  - key: remote_address
    rate_limit:
      unit: second
      requests_per_unit: 10
`

// startEnvoyOver runs drip serve's gRPC listener with envoyOverConfig on
// st, its proofs of denial bounded by denialBytes (negative: none).
func startEnvoyOver(b *testing.B, st store.Store, denialBytes int64) rlsv3.RateLimitServiceClient {
	b.Helper()
	rules := filepath.Join(b.TempDir(), "over.yaml")
	if err := os.WriteFile(rules, []byte(envoyOverConfig), 0o644); err != nil {
		b.Fatal(err)
	}
	s, err := server.New(server.Config{
		Listen: "127.0.0.1:0", AdminListen: "127.0.0.1:0", GRPCListen: "127.0.0.1:0",
		Rules: rules, WatchEvery: -1, StoreTimeout: envoyDeadline, DenialBytes: denialBytes,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	}, st)
	if err != nil {
		b.Fatal(err)
	}
	if err := s.Listen(); err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { s.Serve(ctx); close(done) }()
	conn, err := grpc.NewClient(s.GRPCAddr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		if os.Getenv("DRIP_BENCH_METRICS") != "" {
			resp, err := http.Get("http://" + s.AdminAddr().String() + "/metrics")
			if err == nil {
				body, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				for _, l := range strings.Split(string(body), "\n") {
					if strings.HasPrefix(l, "drip_local_denials_total") || strings.HasPrefix(l, "drip_store_duration_seconds_count") || strings.HasPrefix(l, "drip_decisions_total") {
						b.Log(l)
					}
				}
			}
		}
		conn.Close()
		cancel()
		<-done
	})
	return rlsv3.NewRateLimitServiceClient(conn)
}

// startEnvoyOverPeer is envoyproxy/ratelimit on url with envoyOverConfig
// and its local cache of cacheBytes.
func startEnvoyOverPeer(b *testing.B, url string, cacheBytes int) rlsv3.RateLimitServiceClient {
	return rlsv3.NewRateLimitServiceClient(startPeer(b, envoypeer.Config{
		Redis: strings.TrimPrefix(url, "redis://"), Name: "over.yaml", YAML: envoyOverConfig, Prefix: "bench:rlover:", LocalCacheBytes: cacheBytes,
	}))
}

// overPhase runs the hot key's calls on client for envoyPhase and
// returns calls/s, the CPU per call of this process and redis-server's
// (µs), and the share of calls denied.
func overPhase(b *testing.B, url string, client rlsv3.RateLimitServiceClient) (perSec, cpu, rcpu, denied, commands float64) {
	req := &rlsv3.RateLimitRequest{Domain: "over", Descriptors: []*ratelimitv3.RateLimitDescriptor{
		{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "remote_address", Value: "10.0.0.1"}}}}}
	var n, over atomic.Int64
	var failed atomic.Pointer[error]
	var wg sync.WaitGroup
	r0, c0, k0 := redisCPU(b, url), processCPU(), redisCommands(b, url)
	start := time.Now()
	deadline := start.Add(envoyPhase)
	for range envoyPeerStreams {
		wg.Go(func() {
			for time.Now().Before(deadline) {
				ctx, cancel := context.WithTimeout(context.Background(), envoyDeadline)
				resp, err := client.ShouldRateLimit(ctx, req)
				cancel()
				if err != nil {
					failed.CompareAndSwap(nil, &err)
					return
				}
				if resp.OverallCode == rlsv3.RateLimitResponse_OVER_LIMIT {
					over.Add(1)
				}
				n.Add(1)
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	used, rused := processCPU()-c0, redisCPU(b, url)-r0
	commands = float64(redisCommands(b, url)-k0) / float64(n.Load())
	if err := failed.Load(); err != nil {
		b.Fatal(*err)
	}
	calls := float64(n.Load())
	return calls / elapsed.Seconds(), used.Seconds() * 1e6 / calls, rused * 1e6 / calls, float64(over.Load()) / calls, commands
}

// redisCommands is how many commands the server has run (INFO stats).
func redisCommands(b *testing.B, url string) int64 {
	b.Helper()
	info, err := redisGoClient(b, url, 1).Info(context.Background(), "stats").Result()
	if err != nil {
		b.Fatal(err)
	}
	for _, line := range strings.Split(info, "\n") {
		if k, v, _ := strings.Cut(strings.TrimSpace(line), ":"); k == "total_commands_processed" {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				b.Fatal(err)
			}
			return n
		}
	}
	b.Fatal("INFO stats: no total_commands_processed")
	return 0
}

func BenchmarkEnvoyOverLimit(b *testing.B) {
	url := redisURL(b)
	redisClean(b, url)
	open := func() store.Store {
		s, err := redisstore.Open(url, redisstore.WithPrefix("bench:dripover:"))
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { s.Close() })
		return s
	}
	lease := func(st store.Store) store.Store {
		ls, err := leased.New(st)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { ls.Close() })
		return ls
	}
	ms := memstore.New()
	b.Cleanup(func() { ms.Close() })
	services := []envoyService{
		{"drip-redis", startEnvoyOver(b, open(), 0)},
		{"drip-redis-no-local-denials", startEnvoyOver(b, open(), -1)},
		{"drip-redis-leased", startEnvoyOver(b, lease(open()), 0)},
		{"drip-redis-leased-no-local-denials", startEnvoyOver(b, lease(open()), -1)},
		{"drip-memory", startEnvoyOver(b, ms, 0)},
		{"envoyproxy-ratelimit-local-cache", startEnvoyOverPeer(b, url, 1<<20)},
	}
	if only := os.Getenv("DRIP_BENCH_ENVOY_ONLY"); only != "" {
		services = slices.DeleteFunc(services, func(s envoyService) bool { return s.name != only })
	}
	for range b.N {
		type res struct{ perSec, cpu, denied []float64 }
		out := make([]res, len(services))
		for r := range envoyRoundCount {
			for k := range services {
				i := k
				if r%2 == 1 {
					i = len(services) - 1 - k
				}
				perSec, cpu, rcpu, denied, commands := overPhase(b, url, services[i].client)
				b.Logf("round %d %s: %.0f calls/s, cpu %.1f + redis %.1f µs/call, %.4f denied, %.4f Redis commands/call", r, services[i].name, perSec, cpu, rcpu, denied, commands)
				out[i].perSec = append(out[i].perSec, perSec)
				out[i].cpu = append(out[i].cpu, cpu+rcpu)
				out[i].denied = append(out[i].denied, denied)
			}
		}
		med := func(x []float64) float64 { x = slices.Clone(x); slices.Sort(x); return x[len(x)/2] }
		for i, s := range services {
			b.ReportMetric(med(out[i].perSec), s.name+"-calls/s")
			b.ReportMetric(med(out[i].cpu), s.name+"-cpu-µs/call")
			b.Log(fmt.Sprintf("%s: median %.0f calls/s, %.1f µs CPU/call, %.4f denied", s.name, med(out[i].perSec), med(out[i].cpu), med(out[i].denied)))
		}
	}
	b.ReportMetric(0, "ns/op")
}
