package envoy

import (
	"context"
	"net"
	"sync/atomic"
	"time"

	"github.com/driplimit/drip/internal/conncap"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/reflection"
)

// ServiceName is the gRPC name of the rate limit service, as the health
// service knows it.
const ServiceName = "envoy.service.ratelimit.v3.RateLimitService"

// Server serves a Service over gRPC, with the standard health service
// (grpc.health.v1.Health: SERVING for "" and ServiceName until shutdown)
// and, only when asked, server reflection.
type Server struct {
	GRPC   *grpc.Server
	Health *health.Server

	maxConns int
	calls    atomic.Int64 // unary calls in flight, for Shutdown
}

// Limits bound what the clients of a Server may hold, so that a client
// that opens connections or calls and never finishes them costs bounded
// goroutines and memory. A zero field takes DefaultLimits' value.
type Limits struct {
	// MaxConnections is the most connections open at once; one more is
	// closed as soon as it is accepted (its client sees the connection
	// drop and tries again or elsewhere).
	MaxConnections int
	// MaxConcurrentStreams is the most calls in flight on one connection
	// (HTTP/2 SETTINGS_MAX_CONCURRENT_STREAMS); more are refused with
	// REFUSED_STREAM. Envoy opens more connections when it needs more.
	MaxConcurrentStreams uint32
	// MaxConnectionIdle closes a connection that has had no call for so
	// long.
	MaxConnectionIdle time.Duration
	// MaxConnectionAge asks a connection to go away (GOAWAY) once it is so
	// old; the client reconnects. MaxConnectionAgeGrace later, the
	// connection is closed with whatever calls it still holds: a call
	// that never sends its request (or never reads its answer) lives at
	// most MaxConnectionAge + MaxConnectionAgeGrace.
	MaxConnectionAge      time.Duration
	MaxConnectionAgeGrace time.Duration
}

// DefaultLimits are the limits of NewServer: at most 1024 connections of
// 128 calls each, an idle connection closed after 5 minutes, and every
// connection recycled after 10 minutes (plus 30 s for its calls to end).
// Besides, a call's request is at most 1 MiB (a ShouldRateLimit request
// holds at most 64 descriptors), its headers at most 64 KiB, flow-control
// windows are fixed (64 KiB a call, 1 MiB a connection) so that what a
// connection buffers is bounded, and the HTTP/2 handshake must end within
// 10 s.
var DefaultLimits = Limits{
	MaxConnections:        1024,
	MaxConcurrentStreams:  128,
	MaxConnectionIdle:     5 * time.Minute,
	MaxConnectionAge:      10 * time.Minute,
	MaxConnectionAgeGrace: 30 * time.Second,
}

func (l Limits) withDefaults() Limits {
	d := DefaultLimits
	if l.MaxConnections <= 0 {
		l.MaxConnections = d.MaxConnections
	}
	if l.MaxConcurrentStreams == 0 {
		l.MaxConcurrentStreams = d.MaxConcurrentStreams
	}
	if l.MaxConnectionIdle <= 0 {
		l.MaxConnectionIdle = d.MaxConnectionIdle
	}
	if l.MaxConnectionAge <= 0 {
		l.MaxConnectionAge = d.MaxConnectionAge
	}
	if l.MaxConnectionAgeGrace <= 0 {
		l.MaxConnectionAgeGrace = d.MaxConnectionAgeGrace
	}
	return l
}

// streamWorkers is the number of goroutines that run calls, at a few KiB
// of stack each while idle: the calls in flight of a busy instance (tens
// of thousands of calls a second, a millisecond or two each at the
// store), and no more. gRPC hands a call to the worker idle longest, so
// every worker runs calls between two garbage collections, each of which
// halves an idle worker's stack, which its next call grows again: 256
// workers cost three times what 64 cost in stack copies on a hot key
// (5.8% against 1.6% of the process, BENCHMARKS.md). A call beyond them
// runs on a goroutine of its own.
const streamWorkers = 64

// NewServer returns a gRPC server of svc with DefaultLimits. reflection
// turns on server reflection (off by default in drip serve: it lists the
// services to anyone who can connect).
func NewServer(svc *Service, reflect bool, opts ...grpc.ServerOption) *Server {
	return NewServerWithLimits(svc, reflect, DefaultLimits, opts...)
}

// NewServerWithLimits is NewServer with limits lim; opts come after
// drip's own options, and so win over them.
func NewServerWithLimits(svc *Service, reflect bool, lim Limits, opts ...grpc.ServerOption) *Server {
	lim = lim.withDefaults()
	s := &Server{maxConns: lim.MaxConnections}
	opts = append([]grpc.ServerOption{
		// Unary calls (decisions, health checks) are counted, so that
		// Shutdown knows whether its bound cut one or only connections
		// holding none, or holding streams that never end on their own
		// (health watches, reflection).
		grpc.ChainUnaryInterceptor(func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, next grpc.UnaryHandler) (any, error) {
			s.calls.Add(1)
			defer s.calls.Add(-1)
			return next(ctx, req)
		}),
		// Envoy clusters often send HTTP/2 keepalive pings
		// (connection_keepalive) more often than gRPC-Go's default minimum
		// of 5 minutes, which would answer them with GOAWAY: allow one
		// every 5 seconds, idle or not.
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{
			MinTime: 5 * time.Second, PermitWithoutStream: true,
		}),
		grpc.KeepaliveParams(keepalive.ServerParameters{
			MaxConnectionIdle:     lim.MaxConnectionIdle,
			MaxConnectionAge:      lim.MaxConnectionAge,
			MaxConnectionAgeGrace: lim.MaxConnectionAgeGrace,
			Time:                  time.Minute,      // ping a silent client,
			Timeout:               20 * time.Second, // and drop it if it does not answer
		}),
		grpc.MaxConcurrentStreams(lim.MaxConcurrentStreams),
		grpc.MaxRecvMsgSize(1 << 20),
		grpc.MaxHeaderListSize(64 << 10),
		grpc.InitialWindowSize(64 << 10),
		grpc.InitialConnWindowSize(1 << 20),
		grpc.ConnectionTimeout(10 * time.Second),
		// Calls run on goroutines kept between calls, whose stacks have
		// already grown to a decision's depth, instead of a new goroutine
		// per call that grows its stack (copies it) two or three times on
		// the way to the store: copystack was about a third of the
		// handler's CPU on Redis (see BENCHMARKS.md). A call that finds
		// every worker busy gets a goroutine of its own, as without them.
		grpc.NumStreamWorkers(streamWorkers),
		// Requests read and responses written without reflection (see
		// codec), for this server's calls only.
		grpc.ForceServerCodecV2(newCodec()),
	}, opts...)
	g := grpc.NewServer(opts...)
	rlsv3.RegisterRateLimitServiceServer(g, svc)
	h := health.NewServer()
	h.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	h.SetServingStatus(ServiceName, healthpb.HealthCheckResponse_SERVING)
	healthpb.RegisterHealthServer(g, h)
	if reflect {
		reflection.Register(g)
	}
	s.GRPC, s.Health = g, h
	return s
}

// Serve serves on ln until Shutdown; it returns nil after a shutdown.
// Connections beyond Limits.MaxConnections are closed when accepted.
func (s *Server) Serve(ln net.Listener) error {
	return s.GRPC.Serve(conncap.New(ln, s.maxConns))
}

// Shutdown reports NOT_SERVING to health checks, stops accepting, sends
// GOAWAY on every connection, and waits for calls in flight to finish
// and for the connections to close. When ctx ends first, it closes every
// connection: a client that keeps its connection open (one that never
// acknowledges the GOAWAY) holds the shutdown no longer than ctx. It
// returns ctx's error only when that cut a unary call in flight.
func (s *Server) Shutdown(ctx context.Context) error {
	s.Health.Shutdown()
	done := make(chan struct{})
	go func() {
		s.GRPC.GracefulStop()
		close(done)
	}()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		cut := s.calls.Load() > 0
		s.GRPC.Stop()
		<-done
		if !cut {
			return nil
		}
		return ctx.Err()
	}
}
