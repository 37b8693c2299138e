package main

import (
	"context"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

var grpcRe = regexp.MustCompile(`\(envoy\.service\.ratelimit\.v3, gRPC\) on ([0-9.:]+)`)

// TestServeEnvoy: drip serve --grpc-listen with envoyproxy/ratelimit's
// config as --rules answers Envoy's ShouldRateLimit, and stops cleanly.
func TestServeEnvoy(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "edge.yaml"), []byte("domain: edge\ndescriptors:\n  - key: remote_address\n    rate_limit: {unit: minute, requests_per_unit: 2}\n"), 0o644)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var out, errs lockedBuffer
	code := make(chan int, 1)
	go func() {
		code <- run(ctx, []string{"serve", "--drain=0", "--listen", "127.0.0.1:0", "--admin-listen", "off", "--grpc-listen", "127.0.0.1:0", "--rules", dir}, strings.NewReader(""), &out, &errs)
	}()
	var addr string
	for deadline := time.Now().Add(time.Minute); addr == ""; time.Sleep(5 * time.Millisecond) {
		if m := grpcRe.FindStringSubmatch(out.String()); m != nil {
			addr = m[1]
		} else if time.Now().After(deadline) {
			t.Fatalf("drip serve did not say where gRPC listens:\n%s%s", out.String(), errs.String())
		}
	}
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	c := rlsv3.NewRateLimitServiceClient(conn)
	req := &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*ratelimitv3.RateLimitDescriptor{{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "remote_address", Value: "192.0.2.1"}}}}}
	for i, want := range []rlsv3.RateLimitResponse_Code{rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT} {
		resp, err := c.ShouldRateLimit(context.Background(), req)
		if err != nil || resp.OverallCode != want {
			t.Fatalf("call %d: %v %v, want %v", i+1, resp, err, want)
		}
	}
	cancel()
	select {
	case c := <-code:
		if c != 0 {
			t.Fatalf("exit %d:\n%s", c, errs.String())
		}
	case <-time.After(15 * time.Second):
		t.Fatal("drip serve did not stop")
	}
}
