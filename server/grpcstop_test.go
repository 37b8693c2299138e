package server

import (
	"context"
	"net"
	"path/filepath"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"golang.org/x/net/http2"

	"github.com/driplimit/drip/store/memstore"
)

// TestGRPCShutdownOpenConnections: on shutdown, a call in flight on the
// gRPC listener gets its answer, and connections its clients keep open
// (an idle gRPC client, and one that never answers the GOAWAY's ping)
// hold the shutdown no longer than Config.ShutdownTimeout, and, holding
// no call, are closed without Serve reporting an error.
func TestGRPCShutdownOpenConnections(t *testing.T) {
	dir := t.TempDir()
	envoyFile(t, filepath.Join(dir, "edge.yaml"), 5)
	st := &blocking{Store: memstore.New(), entered: make(chan struct{}), release: make(chan struct{})}
	const timeout = 3 * time.Second
	srv := start(t, Config{Rules: dir, GRPCListen: "127.0.0.1:0", WatchEvery: -1, StoreTimeout: time.Minute, ShutdownTimeout: timeout}, st)

	// An idle client, connected.
	_, idle := grpcClient(t, srv.Server)
	if _, err := idle.Check(context.Background(), nil); err != nil {
		t.Fatal(err)
	}
	// A client that speaks HTTP/2 once and then reads nothing: it
	// answers no ping, so it never acknowledges the GOAWAY.
	raw, err := net.Dial("tcp", srv.GRPCAddr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { raw.Close() })
	if _, err := raw.Write([]byte(http2.ClientPreface)); err != nil {
		t.Fatal(err)
	}
	if err := http2.NewFramer(raw, nil).WriteSettings(); err != nil {
		t.Fatal(err)
	}
	// A call in flight.
	c, _ := grpcClient(t, srv.Server)
	got := make(chan *rlsv3.RateLimitResponse, 1)
	go func() { got <- shouldRateLimit(t, c, "1.2.3.4") }()
	<-st.entered

	stopped := make(chan error, 1)
	began := time.Now()
	go func() { stopped <- srv.stop() }()
	// The shutdown has begun once the listener refuses.
	for {
		conn, err := net.DialTimeout("tcp", srv.GRPCAddr().String(), time.Second)
		if err != nil {
			break
		}
		conn.Close()
		if time.Since(began) > 30*time.Second { // generous: when is not what is tested
			t.Fatal("the gRPC listener still accepts after shutdown began")
		}
		time.Sleep(10 * time.Millisecond)
	}
	close(st.release)
	if r := <-got; r.OverallCode != rlsv3.RateLimitResponse_OK {
		t.Fatalf("in-flight call during shutdown: %v", r)
	}
	select {
	case err := <-stopped:
		if err != nil {
			t.Fatalf("Serve: %v", err)
		}
	case <-time.After(timeout + 30*time.Second): // generous: the bound is timeout
		t.Fatal("Serve did not return: the open gRPC connections hold the shutdown")
	}
}
