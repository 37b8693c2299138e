package envoy

import (
	"context"
	"net"
	"time"

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
}

// NewServer returns a gRPC server of svc. reflection turns on server
// reflection (off by default in drip serve: it lists the services to
// anyone who can connect).
func NewServer(svc *Service, reflect bool, opts ...grpc.ServerOption) *Server {
	// Envoy clusters often send HTTP/2 keepalive pings (connection_keepalive)
	// more often than gRPC-Go's default minimum of 5 minutes, which would
	// answer them with GOAWAY: allow one every 5 seconds, idle or not.
	opts = append([]grpc.ServerOption{grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{
		MinTime: 5 * time.Second, PermitWithoutStream: true,
	})}, opts...)
	g := grpc.NewServer(opts...)
	rlsv3.RegisterRateLimitServiceServer(g, svc)
	h := health.NewServer()
	h.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	h.SetServingStatus(ServiceName, healthpb.HealthCheckResponse_SERVING)
	healthpb.RegisterHealthServer(g, h)
	if reflect {
		reflection.Register(g)
	}
	return &Server{GRPC: g, Health: h}
}

// Serve serves on ln until Shutdown; it returns nil after a shutdown.
func (s *Server) Serve(ln net.Listener) error { return s.GRPC.Serve(ln) }

// Shutdown reports NOT_SERVING to health checks, stops accepting, and
// waits for calls in flight to finish; when ctx ends first, it closes
// every connection and returns ctx's error.
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
		s.GRPC.Stop()
		<-done
		return ctx.Err()
	}
}
