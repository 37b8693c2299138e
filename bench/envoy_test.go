package bench

// Envoy's rate limit service (drip serve --grpc-listen), measured as Envoy
// uses it: the generated gRPC client, ShouldRateLimit calls in flight on
// 64 concurrent streams, on the memory store:
//
//	cd bench && go test -run '^$' -bench 'Envoy' -benchtime 100000x -count 3
//
// Each call carries one descriptor (remote_address, 10,000 addresses), or
// two (remote_address, and a nested path descriptor under it), under
// limits high enough that every call is allowed (the common case; a denial
// costs the same store step). Each call carries Envoy's default timeout of
// 20ms, after which Envoy fails open: over-20ms counts the calls that ran
// out of it, and the p99 must stay far below it.

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/driplimit/drip/server"
	"github.com/driplimit/drip/store"
	"github.com/driplimit/drip/store/memstore"
)

const envoyBenchConfig = `domain: edge
descriptors:
  - key: remote_address
    rate_limit:
      unit: second
      requests_per_unit: 1000000
    descriptors:
      - key: path
        rate_limit:
          unit: second
          requests_per_unit: 1000000
`

// startEnvoy runs drip serve with only its gRPC listener on loopback
// port 0, on the memory store, until the benchmark ends, and returns a
// client of it.
func startEnvoy(b *testing.B) *grpc.ClientConn { return startEnvoyStore(b, memstore.New(), 0) }

// startEnvoyStore is startEnvoy on st, with store calls under deadline
// (0: drip serve's default).
func startEnvoyStore(b *testing.B, st store.Store, deadline time.Duration) *grpc.ClientConn {
	return startEnvoyStoreWith(b, st, deadline, envoyBenchConfig)
}

// startEnvoyStoreWith is startEnvoyStore reading the rules yaml.
func startEnvoyStoreWith(b *testing.B, st store.Store, deadline time.Duration, yaml string) *grpc.ClientConn {
	b.Helper()
	rules := filepath.Join(b.TempDir(), "edge.yaml")
	if err := os.WriteFile(rules, []byte(yaml), 0o644); err != nil {
		b.Fatal(err)
	}
	s, err := server.New(server.Config{
		Listen: "127.0.0.1:0", AdminListen: "off", GRPCListen: "127.0.0.1:0",
		Rules: rules, WatchEvery: -1, StoreTimeout: deadline,
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
	b.Cleanup(func() { conn.Close(); cancel(); <-done })
	return conn
}

func envoyRequests(descriptors int) []*rlsv3.RateLimitRequest {
	return envoyRequestsOver(serveKeys, descriptors)
}

// envoyRequestsOver are calls of one or two descriptors over keys client
// addresses.
func envoyRequestsOver(keys, descriptors int) []*rlsv3.RateLimitRequest {
	reqs := make([]*rlsv3.RateLimitRequest, keys)
	for i := range reqs {
		ip := &ratelimitv3.RateLimitDescriptor_Entry{Key: "remote_address", Value: fmt.Sprintf("10.%d.%d.%d", i>>16&255, i>>8&255, i&255)}
		ds := []*ratelimitv3.RateLimitDescriptor{{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{ip}}}
		if descriptors == 2 {
			ds = append(ds, &ratelimitv3.RateLimitDescriptor{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{ip, {Key: "path", Value: "/api/orders"}}})
		}
		reqs[i] = &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: ds}
	}
	return reqs
}

func BenchmarkEnvoyShouldRateLimit(b *testing.B) {
	conn := startEnvoy(b)
	client := rlsv3.NewRateLimitServiceClient(conn)
	for _, nd := range []int{1, 2} {
		reqs := envoyRequests(nd)
		for _, r := range reqs[:200] { // warm the connection and the buckets
			if _, err := client.ShouldRateLimit(context.Background(), r); err != nil {
				b.Fatal(err)
			}
		}
		// rate 0: each stream sends its next call as soon as the last
		// returns (saturation: latency is mostly queueing, client and
		// server sharing the CPUs); else the streams together send rate
		// calls per second on a fixed schedule (calls/s reports the rate
		// achieved), the load of a busy Envoy fleet short of saturation.
		for _, rate := range []int{0, 5000} {
			name := fmt.Sprintf("descriptors=%d/streams=64", nd)
			if rate > 0 {
				name += fmt.Sprintf("/rate=%d", rate)
			}
			b.Run(name, func(b *testing.B) { benchEnvoy(b, client, reqs, rate) })
		}
	}
}

func benchEnvoy(b *testing.B, client rlsv3.RateLimitServiceClient, reqs []*rlsv3.RateLimitRequest, rate int) {
	const streams = 64
	var next atomic.Int64
	lat := make([][]time.Duration, streams)
	var wg sync.WaitGroup
	var failed atomic.Pointer[error]
	var timeouts atomic.Int64
	b.ResetTimer()
	start := time.Now()
	for w := range streams {
		wg.Go(func() {
			mine := make([]time.Duration, 0, b.N/streams+1)
			for {
				i := next.Add(1) - 1
				if i >= int64(b.N) {
					break
				}
				if rate > 0 {
					time.Sleep(time.Until(start.Add(time.Duration(i) * time.Second / time.Duration(rate))))
				}
				t0 := time.Now()
				// Envoy's default timeout, after which it fails open.
				ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
				resp, err := client.ShouldRateLimit(ctx, reqs[int(i*7919)%len(reqs)])
				cancel()
				mine = append(mine, time.Since(t0))
				if status.Code(err) == codes.DeadlineExceeded {
					timeouts.Add(1)
					continue
				}
				if err == nil && resp.OverallCode != rlsv3.RateLimitResponse_OK {
					err = fmt.Errorf("call %d: %v", i, resp.OverallCode)
				}
				if err != nil {
					failed.Store(&err)
					break
				}
			}
			lat[w] = mine
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	b.StopTimer()
	if err := failed.Load(); err != nil {
		b.Fatal(*err)
	}
	all := slices.Concat(lat...)
	slices.Sort(all)
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "calls/s")
	b.ReportMetric(pct(all, 0.5), "p50-µs")
	b.ReportMetric(pct(all, 0.99), "p99-µs")
	b.ReportMetric(pct(all, 0.999), "p99.9-µs")
	b.ReportMetric(float64(timeouts.Load()), "over-20ms")
	b.ReportMetric(0, "ns/op")
}
