package xds_test

import (
	"context"
	"log/slog"
	"net"
	"strconv"
	"sync"
	"testing"
	"time"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	rlconfv3 "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/driplimit/drip/server/envoy"
	"github.com/driplimit/drip/server/envoy/xds"
	"github.com/driplimit/drip/server/envoy/xds/xdstest"
)

// stubborn is an xDS server that answers every NACK by sending the
// refused snapshot again (a new nonce, the same version), up to limit
// times, and sends push's snapshots as they come.
type stubborn struct {
	discoveryv3.UnimplementedAggregatedDiscoveryServiceServer
	limit int
	push  chan *discoveryv3.DiscoveryResponse

	mu      sync.Mutex
	nacks   int
	acks    []string
	changed chan struct{}
}

func (s *stubborn) note(f func()) {
	s.mu.Lock()
	f()
	close(s.changed)
	s.changed = make(chan struct{})
	s.mu.Unlock()
}

func (s *stubborn) StreamAggregatedResources(st discoveryv3.AggregatedDiscoveryService_StreamAggregatedResourcesServer) error {
	reqs := make(chan *discoveryv3.DiscoveryRequest)
	go func() {
		for {
			r, err := st.Recv()
			if err != nil {
				close(reqs)
				return
			}
			reqs <- r
		}
	}()
	var last *discoveryv3.DiscoveryResponse
	nonce := 0
	send := func(r *discoveryv3.DiscoveryResponse) error {
		nonce++
		last = &discoveryv3.DiscoveryResponse{VersionInfo: r.VersionInfo, Resources: r.Resources, TypeUrl: r.TypeUrl, Nonce: strconv.Itoa(nonce)}
		return st.Send(last)
	}
	for {
		select {
		case r := <-s.push:
			if err := send(r); err != nil {
				return err
			}
		case r, ok := <-reqs:
			if !ok {
				return nil
			}
			switch {
			case r.ResponseNonce == "":
			case r.ErrorDetail != nil:
				n := 0
				s.note(func() { s.nacks++; n = s.nacks })
				if n < s.limit {
					if err := send(last); err != nil {
						return err
					}
				}
			default:
				s.note(func() { s.acks = append(s.acks, r.VersionInfo) })
			}
		}
	}
}

func snapshot(t *testing.T, version string, cfg *rlconfv3.RateLimitConfig) *discoveryv3.DiscoveryResponse {
	a, err := anypb.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return &discoveryv3.DiscoveryResponse{VersionInfo: version, TypeUrl: xds.TypeURL, Resources: []*anypb.Any{a}}
}

// TestNACKBackoff: against a server that sends a refused snapshot again
// after each NACK, the client NACKs it twice at once, then each time
// after a backoff from Initial doubling to Max (on an injected clock):
// over a simulated minute, 2 NACKs and one per wait, not one per round
// trip; a new snapshot meanwhile applies at once.
func TestNACKBackoff(t *testing.T) {
	const limit = 1000 // the server's resends: a loop ends there
	srv := &stubborn{limit: limit, push: make(chan *discoveryv3.DiscoveryResponse, 1), changed: make(chan struct{})}
	g := grpc.NewServer()
	discoveryv3.RegisterAggregatedDiscoveryServiceServer(g, srv)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go g.Serve(ln)
	t.Cleanup(g.Stop)

	c, err := xds.New(xds.Config{Server: ln.Addr().String(), NodeID: node,
		Backoff: xds.Backoff{Initial: time.Second, Max: 8 * time.Second},
		Logger:  slog.New(slog.NewTextHandler(t.Output(), nil))},
		func(_ string, files []envoy.File) error {
			_, err := envoy.Parse(files...)
			return err
		})
	if err != nil {
		t.Fatal(err)
	}
	type wait struct {
		d    time.Duration
		fire chan time.Time
	}
	waits := make(chan wait)
	xds.SetClock(c, func(d time.Duration) <-chan time.Time {
		w := wait{d, make(chan time.Time, 1)}
		waits <- w
		return w.fire
	}, func() float64 { return 0.5 })
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); c.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })

	nacks := func() int {
		srv.mu.Lock()
		defer srv.mu.Unlock()
		return srv.nacks
	}
	// next is the client's next wait; it fails if the server's resends
	// run out first (the client looped).
	next := func() wait {
		t.Helper()
		deadline := time.After(xdstest.Wait)
		for {
			srv.mu.Lock()
			n, ch := srv.nacks, srv.changed
			srv.mu.Unlock()
			if n >= limit {
				t.Fatalf("%d NACKs of one version without a wait", n)
			}
			select {
			case w := <-waits:
				return w
			case <-ch:
			case <-deadline:
				t.Fatalf("no wait within %s (%d NACKs)", xdstest.Wait, n)
			}
		}
	}

	srv.push <- snapshot(t, "bad", xdstest.Config("a", "d", xdstest.Limit("k", "", 1, rlconfv3.RateLimitUnit_UNKNOWN)))
	var elapsed time.Duration
	want := []time.Duration{time.Second, 2 * time.Second, 4 * time.Second, 8 * time.Second, 8 * time.Second}
	for i := 0; elapsed < time.Minute; i++ {
		w := next()
		if n := nacks(); n != 2+i {
			t.Fatalf("%d NACKs at wait %d, want %d", n, i, 2+i)
		}
		if wd := want[min(i, len(want)-1)]; w.d != wd {
			t.Fatalf("wait %d: %v, want %v", i, w.d, wd)
		}
		elapsed += w.d
		w.fire <- time.Time{}
	}
	// 1+2+4+8+...: the waits passed a minute at the 10th.
	w := next()
	if n := nacks(); n != 12 {
		t.Fatalf("%d NACKs over a simulated minute, want 12", n)
	}

	// A good snapshot while a NACK waits: applied at once, and the NACK
	// waiting is dropped.
	srv.push <- snapshot(t, "good", xdstest.Config("a", "d", xdstest.Limit("k", "", 1, rlconfv3.RateLimitUnit_SECOND)))
	deadline := time.After(xdstest.Wait)
	for {
		srv.mu.Lock()
		acked, ch := len(srv.acks) > 0 && srv.acks[len(srv.acks)-1] == "good", srv.changed
		srv.mu.Unlock()
		if acked {
			break
		}
		select {
		case <-ch:
		case <-deadline:
			t.Fatal("the good snapshot was not applied while a NACK waited")
		}
	}
	w.fire <- time.Time{} // too late: nothing is sent
	if n := nacks(); n != 12 || c.Version() != "good" {
		t.Fatalf("after the good snapshot: %d NACKs, version %q", n, c.Version())
	}
}
