package xds_test

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	rlconfv3 "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"

	"github.com/driplimit/drip/engine"
	"github.com/driplimit/drip/internal/testkit/testclock"
	"github.com/driplimit/drip/server/envoy"
	"github.com/driplimit/drip/server/envoy/xds"
	"github.com/driplimit/drip/server/envoy/xds/xdstest"
	"github.com/driplimit/drip/store/memstore"
)

const node = "envoy-ratelimit"

// follow starts a client of srv that swaps each snapshot into svc, and
// returns it; it stops when the test ends.
func follow(t *testing.T, srv *xdstest.Server, svc *envoy.Service, applied *atomic.Int64) *xds.Client {
	t.Helper()
	return followConfig(t, xds.Config{Server: srv.Addr, NodeID: node,
		Backoff: xds.Backoff{Initial: 10 * time.Millisecond, Max: 100 * time.Millisecond}}, svc, applied)
}

// followConfig is follow with the client's Config (its Logger: the
// test's output).
func followConfig(t *testing.T, cfg xds.Config, svc *envoy.Service, applied *atomic.Int64) *xds.Client {
	t.Helper()
	cfg.Logger = slog.New(slog.NewTextHandler(t.Output(), nil))
	c, err := xds.New(cfg,
		func(_ string, files []envoy.File) error {
			cfg, err := envoy.ParseWith(envoy.Options{}, files...)
			if err != nil {
				return err
			}
			svc.Swap(cfg)
			if applied != nil {
				applied.Add(1)
			}
			return nil
		})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); c.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	return c
}

func request(domain string, kv ...string) *rlsv3.RateLimitRequest {
	d := &ratelimitv3.RateLimitDescriptor{}
	for i := 0; i < len(kv); i += 2 {
		d.Entries = append(d.Entries, &ratelimitv3.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	return &rlsv3.RateLimitRequest{Domain: domain, Descriptors: []*ratelimitv3.RateLimitDescriptor{d}}
}

// code asks svc once.
func code(t *testing.T, svc *envoy.Service, req *rlsv3.RateLimitRequest) rlsv3.RateLimitResponse_Code {
	t.Helper()
	resp, err := svc.ShouldRateLimit(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	return resp.OverallCode
}

// TestSnapshotsUnderLoad: snapshots pushed while calls run apply whole
// (a call sees the old configuration or the new one, never none), each
// is ACKed; an invalid one is NACKed with the parser's error and the one
// in force keeps answering; buckets keep their state across snapshots.
func TestSnapshotsUnderLoad(t *testing.T) {
	srv := xdstest.Start(t, nil)
	ck := testclock.At(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	svc := envoy.NewService(memstore.New(), nil, engine.WithClock(ck.Now))
	// v1: 2 a minute on path=/a; nothing on /b.
	srv.Push(t, node, "v1", xdstest.Config("api", "gw", xdstest.Limit("path", "/a", 2, rlconfv3.RateLimitUnit_MINUTE)))
	c := follow(t, srv, svc, nil)
	select {
	case <-c.Applied():
	case <-time.After(xdstest.Wait):
		t.Fatal("no snapshot applied")
	}
	srv.WaitAck(t, "v1")
	a, b := request("gw", "path", "/a"), request("gw", "path", "/b")
	for i, want := range []rlsv3.RateLimitResponse_Code{rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT} {
		if got := code(t, svc, a); got != want {
			t.Fatalf("v1, /a call %d: %v, want %v", i, got, want)
		}
	}
	if got := code(t, svc, b); got != rlsv3.RateLimitResponse_OK {
		t.Fatalf("v1, /b: %v", got)
	}

	// Load: callers on /b all along; under v1 and v2 every answer is
	// OK or OVER_LIMIT and never an error.
	ctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var calls, failures atomic.Int64
	for range 8 {
		wg.Go(func() {
			for ctx.Err() == nil {
				if _, err := svc.ShouldRateLimit(context.Background(), request("gw", "path", "/b")); err != nil {
					failures.Add(1)
				}
				calls.Add(1)
			}
		})
	}

	// v2: /a keeps its limit (and its bucket: still over), /b gets 1 a
	// minute.
	srv.Push(t, node, "v2", xdstest.Config("api", "gw",
		xdstest.Limit("path", "/a", 2, rlconfv3.RateLimitUnit_MINUTE),
		xdstest.Limit("path", "/b", 1, rlconfv3.RateLimitUnit_MINUTE)))
	srv.WaitAck(t, "v2")
	if got := code(t, svc, a); got != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("v2, /a: %v: the bucket lost its state", got)
	}
	// 1 a minute on a clock that stands still: of two calls, the second
	// is over whoever took the one request.
	code(t, svc, b)
	if got := code(t, svc, b); got != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("v2, /b under load: %v, want OVER_LIMIT (1 a minute)", got)
	}

	// v3 is invalid: no unit. NACKed; v2 stays.
	srv.Push(t, node, "v3", xdstest.Config("api", "gw", xdstest.Limit("path", "/b", 1000, rlconfv3.RateLimitUnit_UNKNOWN)))
	msg := srv.WaitNack(t, "v3")
	if !strings.Contains(msg, "unit") {
		t.Fatalf("NACK of v3: %q does not name the unit", msg)
	}
	if got := code(t, svc, b); got != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("after the NACK, /b: %v: v2 does not answer", got)
	}
	if v := c.Version(); v != "v2" {
		t.Fatalf("version in force %q, want v2", v)
	}
	stop()
	wg.Wait()
	if n := failures.Load(); n > 0 {
		t.Fatalf("%d of %d calls under load failed", n, calls.Load())
	}
	if srv.Acked("v3") {
		t.Fatal("v3 ACKed")
	}

	// v4, valid again: applied.
	srv.Push(t, node, "v4", xdstest.Config("api", "gw"))
	srv.WaitAck(t, "v4")
	if got := code(t, svc, b); got != rlsv3.RateLimitResponse_OK {
		t.Fatalf("v4 (no limits), /b: %v", got)
	}
}

// TestReconnect: a client started before its server retries until the
// server is there, and then gets the snapshot.
func TestReconnect(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nobody listens there until the server starts
	var applied atomic.Int64
	svc := envoy.NewService(memstore.New(), nil)
	c, err := xds.New(xds.Config{Server: addr, NodeID: node, Backoff: xds.Backoff{Initial: time.Millisecond, Max: 20 * time.Millisecond},
		Logger: slog.New(slog.NewTextHandler(t.Output(), nil))},
		func(_ string, files []envoy.File) error {
			cfg, err := envoy.Parse(files...)
			if err == nil {
				svc.Swap(cfg)
				applied.Add(1)
			}
			return err
		})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); c.Run(ctx) }()
	defer func() { cancel(); <-done }()
	time.Sleep(50 * time.Millisecond) // a few failed attempts first (not a condition under test)
	if applied.Load() != 0 {
		t.Fatal("applied a snapshot from nowhere")
	}
	srv := xdstest.StartOn(t, addr, nil)
	srv.Push(t, node, "1", xdstest.Config("api", "gw", xdstest.Limit("k", "", 0, rlconfv3.RateLimitUnit_SECOND)))
	srv.WaitAck(t, "1")
	if got := code(t, svc, request("gw", "k", "x")); got != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("requests_per_unit 0: %v", got)
	}
}

// TestBackoff: the waits double from Initial to Max, and jitter stays
// within RandomFactor.
func TestBackoff(t *testing.T) {
	b := xds.Backoff{Initial: time.Second, Max: 5 * time.Second}
	var got []string
	for n := range 5 {
		got = append(got, xds.Wait(b, n, func() float64 { return 0 }).String())
	}
	if s := fmt.Sprint(got); s != "[1s 2s 4s 5s 5s]" {
		t.Fatalf("waits %s", s)
	}
	b.Jitter, b.RandomFactor = true, 0.5
	for _, tc := range []struct {
		n    int
		r    float64
		want time.Duration
	}{{0, 0, 500 * time.Millisecond}, {0, 1, 1500 * time.Millisecond}, {1, 0.5, 2 * time.Second}, {3, 1, 5 * time.Second}, {3, 0, 2500 * time.Millisecond}} {
		if d := xds.Wait(b, tc.n, func() float64 { return tc.r }); d != tc.want {
			t.Errorf("wait %d at %v: %v, want %v", tc.n, tc.r, d, tc.want)
		}
	}
}

// TestFiles: a resource reads as the file that says the same.
func TestFiles(t *testing.T) {
	d := xdstest.Limit("key", "v", 7, rlconfv3.RateLimitUnit_HOUR,
		&rlconfv3.RateLimitDescriptor{Key: "sub", RateLimit: &rlconfv3.RateLimitPolicy{Unlimited: true}},
		&rlconfv3.RateLimitDescriptor{Key: "shadow", ShadowMode: true, RateLimit: &rlconfv3.RateLimitPolicy{Unit: rlconfv3.RateLimitUnit_DAY, RequestsPerUnit: 3, Name: "s", Replaces: []*rlconfv3.RateLimitReplace{{Name: "x"}}}})
	files, err := xds.Files([]*rlconfv3.RateLimitConfig{xdstest.Config("n", "dom", d)})
	if err != nil {
		t.Fatal(err)
	}
	want := `domain: dom
descriptors:
    - key: key
      value: v
      rate_limit:
        unit: hour
        requests_per_unit: 7
      descriptors:
        - key: sub
          rate_limit:
            unlimited: true
        - key: shadow
          rate_limit:
            unit: day
            requests_per_unit: 3
            name: s
            replaces:
                - name: x
          shadow_mode: true
`
	if len(files) != 1 || files[0].Name != "xds:n" {
		t.Fatalf("%+v", files)
	}
	got, err := envoy.Parse(files...)
	if err != nil {
		t.Fatal(err)
	}
	same, err := envoy.Parse(envoy.File{Name: "xds:n", Data: []byte(want)})
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got.Limits(), same.Limits()) || len(got.Limits()) != 3 {
		t.Fatalf("the resource reads as %+v, not as\n%s", got.Limits(), want)
	}
	deep := &rlconfv3.RateLimitDescriptor{Key: "k"}
	for range xds.MaxDepth {
		deep = &rlconfv3.RateLimitDescriptor{Key: "k", Descriptors: []*rlconfv3.RateLimitDescriptor{deep}}
	}
	if _, err := xds.Files([]*rlconfv3.RateLimitConfig{xdstest.Config("n", "dom", deep)}); err == nil {
		t.Fatal("descriptors nested past MaxDepth accepted")
	}
}

// TestNACKNoLoop: a server that sends a refused snapshot again on each
// NACK (go-control-plane's snapshot cache, as Envoy Gateway runs it) and
// the client do not loop: the snapshot is read once, NACKed twice, and a
// good one after it applies.
func TestNACKNoLoop(t *testing.T) {
	srv := xdstest.Start(t, nil)
	var reads atomic.Int64
	c, err := xds.New(xds.Config{Server: srv.Addr, NodeID: node, Logger: slog.New(slog.NewTextHandler(t.Output(), nil))},
		func(_ string, files []envoy.File) error {
			reads.Add(1)
			_, err := envoy.Parse(files...)
			return err
		})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); c.Run(ctx) }()
	defer func() { cancel(); <-done }()
	srv.Push(t, node, "1", xdstest.Config("a", "d", xdstest.Limit("k", "", 1, rlconfv3.RateLimitUnit_SECOND)))
	srv.WaitAck(t, "1")
	srv.Push(t, node, "2", xdstest.Config("a", "d", xdstest.Limit("k", "", 1, rlconfv3.RateLimitUnit_UNKNOWN)))
	srv.WaitNack(t, "2")
	time.Sleep(200 * time.Millisecond) // room for a loop to show (an absence)
	srv.Push(t, node, "3", xdstest.Config("a", "d"))
	srv.WaitAck(t, "3")
	if n := reads.Load(); n != 3 {
		t.Fatalf("%d snapshots read for versions 1, 2 (refused) and 3: want 3", n)
	}
	if v := c.Version(); v != "3" {
		t.Fatalf("version %q", v)
	}
}

// TestHostileSnapshots: a snapshot whose descriptors nest deeper than
// MaxDepth is refused (NACK, naming the bound) and one larger than
// MaxMessage ends the stream before it is read; in both cases the
// configuration in force stays and answers, and the next good snapshot
// applies.
func TestHostileSnapshots(t *testing.T) {
	srv := xdstest.Start(t, nil)
	svc := envoy.NewService(memstore.New(), nil)
	c := follow(t, srv, svc, nil)
	srv.Push(t, node, "1", xdstest.Config("a", "d", xdstest.Limit("k", "", 0, rlconfv3.RateLimitUnit_SECOND)))
	srv.WaitAck(t, "1")
	over := func() {
		t.Helper()
		if got := code(t, svc, request("d", "k", "v")); got != rlsv3.RateLimitResponse_OVER_LIMIT {
			t.Fatalf("version 1's limit of 0: %v", got)
		}
	}
	over()

	deep := xdstest.Limit("k", "", 5, rlconfv3.RateLimitUnit_SECOND)
	for range xds.MaxDepth + 8 {
		deep = xdstest.Limit("k", "", 5, rlconfv3.RateLimitUnit_SECOND, deep)
	}
	srv.Push(t, node, "2", xdstest.Config("a", "d", deep))
	if msg := srv.WaitNack(t, "2"); !strings.Contains(msg, fmt.Sprintf("deeper than %d levels", xds.MaxDepth)) {
		t.Errorf("NACK of a deep snapshot: %q", msg)
	}
	over()

	huge := xdstest.Limit("k", strings.Repeat("v", xds.MaxMessage), 5, rlconfv3.RateLimitUnit_SECOND)
	streams := srv.Streams()
	srv.Push(t, node, "3", xdstest.Config("a", "d", huge))
	// The client drops the stream and opens another (which gets the same
	// snapshot): wait for two more.
	deadline := time.Now().Add(xdstest.Wait)
	for srv.Streams() < streams+2 {
		if time.Now().After(deadline) {
			t.Fatalf("%d streams after a snapshot over MaxMessage: the client did not drop it", srv.Streams()-streams)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if srv.Acked("3") || c.Version() != "1" {
		t.Fatalf("a snapshot over MaxMessage: acked %v, version %q", srv.Acked("3"), c.Version())
	}
	over()

	srv.Push(t, node, "4", xdstest.Config("a", "d", xdstest.Limit("k", "", 5, rlconfv3.RateLimitUnit_SECOND)))
	srv.WaitAck(t, "4")
	if got := code(t, svc, request("d", "k", "v")); got != rlsv3.RateLimitResponse_OK {
		t.Errorf("version 4: %v", got)
	}
}
