// Package xdstest runs an xDS server for tests: go-control-plane's own
// state-of-the-world server over a snapshot cache, serving
// RateLimitConfig resources as Envoy Gateway's control plane does, and
// recording the ACKs and NACKs its clients send. Only tests import it.
package xdstest

import (
	"context"
	"crypto/tls"
	"net"
	"sync"
	"testing"
	"time"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	serverv3 "github.com/envoyproxy/go-control-plane/pkg/server/v3"
	rlconfv3 "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
)

// Wait is how long the Wait methods wait: generous, for a loaded
// machine.
const Wait = 30 * time.Second

// Server is a running xDS server.
type Server struct {
	// Addr is its address, host:port.
	Addr  string
	cache cachev3.SnapshotCache

	mu      sync.Mutex
	changed chan struct{} // closed and replaced on each request
	acks    map[string]bool
	nacks   map[string]string // the NACKed version's error (by nonce's version)
	sent    map[string]string // nonce -> version of the response
	streams int
}

// Start starts a server on a free loopback port, with TLS when tlsCfg is
// set; it stops when the test ends.
func Start(t testing.TB, tlsCfg *tls.Config) *Server {
	t.Helper()
	return StartOn(t, "127.0.0.1:0", tlsCfg)
}

// StartOn is Start on the address addr.
func StartOn(t testing.TB, addr string, tlsCfg *tls.Config) *Server {
	t.Helper()
	s := &Server{changed: make(chan struct{}), acks: map[string]bool{}, nacks: map[string]string{}, sent: map[string]string{}}
	s.cache = cachev3.NewSnapshotCache(false, cachev3.IDHash{}, quiet{})
	cb := serverv3.CallbackFuncs{
		StreamOpenFunc: func(context.Context, int64, string) error {
			s.note(func() { s.streams++ })
			return nil
		},
		StreamRequestFunc: func(_ int64, r *discoveryv3.DiscoveryRequest) error {
			s.note(func() {
				if r.ResponseNonce == "" {
					return
				}
				if r.ErrorDetail != nil {
					s.nacks[s.sent[r.ResponseNonce]] = r.ErrorDetail.Message
				} else {
					s.acks[r.VersionInfo] = true
				}
			})
			return nil
		},
		StreamResponseFunc: func(_ context.Context, _ int64, _ *discoveryv3.DiscoveryRequest, r *discoveryv3.DiscoveryResponse) {
			s.note(func() { s.sent[r.Nonce] = r.VersionInfo })
		},
	}
	ctx, cancel := context.WithCancel(context.Background())
	xs := serverv3.NewServer(ctx, s.cache, cb)
	var opts []grpc.ServerOption
	if tlsCfg != nil {
		opts = append(opts, grpc.Creds(credentials.NewTLS(tlsCfg)))
	}
	g := grpc.NewServer(opts...)
	discoveryv3.RegisterAggregatedDiscoveryServiceServer(g, xs)
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	s.Addr = ln.Addr().String()
	go g.Serve(ln)
	t.Cleanup(func() {
		g.Stop()
		cancel()
	})
	return s
}

func (s *Server) note(f func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	f()
	close(s.changed)
	s.changed = make(chan struct{})
}

// Push makes cfgs node's snapshot at version.
func (s *Server) Push(t testing.TB, node, version string, cfgs ...*rlconfv3.RateLimitConfig) {
	t.Helper()
	res := make([]types.Resource, len(cfgs))
	for i, c := range cfgs {
		res[i] = c
	}
	snap, err := cachev3.NewSnapshot(version, map[resource.Type][]types.Resource{resource.RateLimitConfigType: res})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.cache.SetSnapshot(context.Background(), node, snap); err != nil {
		t.Fatal(err)
	}
}

// WaitAck waits until a client ACKs version.
func (s *Server) WaitAck(t testing.TB, version string) {
	t.Helper()
	s.wait(t, "an ACK of version "+version, func() bool { return s.acks[version] })
}

// WaitNack waits until a client NACKs version, and returns its error.
func (s *Server) WaitNack(t testing.TB, version string) string {
	t.Helper()
	var msg string
	s.wait(t, "a NACK of version "+version, func() bool {
		m, ok := s.nacks[version]
		msg = m
		return ok
	})
	return msg
}

// Acked says whether a client ACKed version.
func (s *Server) Acked(version string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.acks[version]
}

// Streams is how many streams clients opened.
func (s *Server) Streams() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.streams
}

func (s *Server) wait(t testing.TB, what string, done func() bool) {
	t.Helper()
	deadline := time.NewTimer(Wait)
	defer deadline.Stop()
	for {
		s.mu.Lock()
		ok, ch := done(), s.changed
		s.mu.Unlock()
		if ok {
			return
		}
		select {
		case <-ch:
		case <-deadline.C:
			t.Fatalf("xdstest: no %s within %s", what, Wait)
		}
	}
}

// Config is a RateLimitConfig of one domain: name, domain, descriptors.
func Config(name, domain string, descs ...*rlconfv3.RateLimitDescriptor) *rlconfv3.RateLimitConfig {
	return &rlconfv3.RateLimitConfig{Name: name, Domain: domain, Descriptors: descs}
}

// Limit is a descriptor key=value (value may be "") with a limit of n
// per unit, and sub-descriptors.
func Limit(key, value string, n uint32, unit rlconfv3.RateLimitUnit, subs ...*rlconfv3.RateLimitDescriptor) *rlconfv3.RateLimitDescriptor {
	return &rlconfv3.RateLimitDescriptor{Key: key, Value: value, Descriptors: subs,
		RateLimit: &rlconfv3.RateLimitPolicy{Unit: unit, RequestsPerUnit: n}}
}

// quiet is the cache's logger: silent.
type quiet struct{}

func (quiet) Debugf(string, ...any) {}
func (quiet) Infof(string, ...any)  {}
func (quiet) Warnf(string, ...any)  {}
func (quiet) Errorf(string, ...any) {}
