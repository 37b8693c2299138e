package main

import (
	"context"
	"net"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
)

// trivialRLS is the least an Envoy rate limit service written with
// grpc-go can do: it answers every call OK, one status per descriptor,
// and keeps no state. Its CPU per call is the floor of the gRPC path that
// drip serve and envoyproxy/ratelimit both stand on.
type trivialRLS struct {
	rlsv3.UnimplementedRateLimitServiceServer
}

func (trivialRLS) ShouldRateLimit(_ context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	st := make([]*rlsv3.RateLimitResponse_DescriptorStatus, len(req.Descriptors))
	for i := range st {
		st[i] = &rlsv3.RateLimitResponse_DescriptorStatus{Code: rlsv3.RateLimitResponse_OK}
	}
	return &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK, Statuses: st}, nil
}

// serveTrivialRLS serves trivialRLS on addr.
func serveTrivialRLS(addr string) {
	ln, err := net.Listen("tcp", addr)
	check(err)
	gs := grpc.NewServer()
	rlsv3.RegisterRateLimitServiceServer(gs, trivialRLS{})
	check(gs.Serve(ln))
}
