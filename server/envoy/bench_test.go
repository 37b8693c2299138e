package envoy

import (
	"context"
	"fmt"
	"testing"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/driplimit/drip/store/memstore"
)

// BenchmarkShouldRateLimit is the service's own work per call, without
// gRPC: matching, the store step, the response and its headers.
func BenchmarkShouldRateLimit(b *testing.B) {
	c, err := Parse(File{Name: "b.yaml", Data: []byte(`domain: edge
descriptors:
  - key: remote_address
    rate_limit: {unit: second, requests_per_unit: 1000000}
    descriptors:
      - key: path
        rate_limit: {unit: second, requests_per_unit: 1000000}
`)})
	if err != nil {
		b.Fatal(err)
	}
	svc := NewService(memstore.New(), c)
	reqs := make([]*rlsv3.RateLimitRequest, 1000)
	for i := range reqs {
		ip := &ratelimitv3.RateLimitDescriptor_Entry{Key: "remote_address", Value: fmt.Sprint("10.0.0.", i)}
		reqs[i] = &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*ratelimitv3.RateLimitDescriptor{
			{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{ip}},
			{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{ip, {Key: "path", Value: "/api"}}},
		}}
	}
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		resp, err := svc.ShouldRateLimit(context.Background(), reqs[i%len(reqs)])
		if err != nil || resp.OverallCode != rlsv3.RateLimitResponse_OK {
			b.Fatal(resp, err)
		}
	}
}
