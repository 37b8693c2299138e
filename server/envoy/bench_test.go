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
	c, reqs := twoDescriptors(b, 1000)
	svc := NewService(memstore.New(), c)
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		resp, err := svc.ShouldRateLimit(context.Background(), reqs[i%len(reqs)])
		if err != nil || resp.OverallCode != rlsv3.RateLimitResponse_OK {
			b.Fatal(resp, err)
		}
	}
}

// twoDescriptors is a configuration of an address and a path under it,
// and n requests of two descriptors (n addresses, one path).
func twoDescriptors(tb testing.TB, n int) (*Config, []*rlsv3.RateLimitRequest) {
	c, err := Parse(File{Name: "b.yaml", Data: []byte(`domain: edge
descriptors:
  - key: remote_address
    rate_limit: {unit: second, requests_per_unit: 1000000}
    descriptors:
      - key: path
        rate_limit: {unit: second, requests_per_unit: 1000000}
`)})
	if err != nil {
		tb.Fatal(err)
	}
	reqs := make([]*rlsv3.RateLimitRequest, n)
	for i := range reqs {
		ip := &ratelimitv3.RateLimitDescriptor_Entry{Key: "remote_address", Value: fmt.Sprint("10.0.0.", i)}
		reqs[i] = &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*ratelimitv3.RateLimitDescriptor{
			{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{ip}},
			{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{ip, {Key: "path", Value: "/api"}}},
		}}
	}
	return c, reqs
}
