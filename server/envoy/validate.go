package envoy

import (
	"fmt"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// validate checks a request's shape; a bad one gets InvalidArgument.
func validate(req *rlsv3.RateLimitRequest) error {
	if req.Domain == "" {
		return status.Error(codes.InvalidArgument, "rate limit domain must not be empty")
	}
	if len(req.Descriptors) == 0 {
		return status.Error(codes.InvalidArgument, "rate limit descriptor list must not be empty")
	}
	if len(req.Descriptors) > MaxDescriptors {
		return status.Errorf(codes.InvalidArgument, "%d descriptors: at most %d per request", len(req.Descriptors), MaxDescriptors)
	}
	for i, d := range req.Descriptors {
		if d == nil || len(d.Entries) == 0 {
			return status.Errorf(codes.InvalidArgument, "descriptors[%d]: no entries", i)
		}
		if len(d.Entries) > MaxEntries {
			return status.Errorf(codes.InvalidArgument, "descriptors[%d]: %d entries: at most %d", i, len(d.Entries), MaxEntries)
		}
		for j, e := range d.Entries {
			if e == nil || e.Key == "" {
				return status.Errorf(codes.InvalidArgument, "descriptors[%d].entries[%d]: empty key", i, j)
			}
		}
		if d.HitsAddend != nil && float64(d.HitsAddend.GetValue()) > maxCost {
			return status.Errorf(codes.InvalidArgument, "descriptors[%d].hits_addend: %d is more than %g", i, d.HitsAddend.GetValue(), float64(maxCost))
		}
	}
	return nil
}

// OverrideSuffix ends the name of every limit a request sets itself
// (RateLimitDescriptor.limit): "<domain>.request_limit".
const OverrideSuffix = ".request_limit"

// override is the limit a descriptor's own "limit" sets.
func override(domain string, d *ratelimitv3.RateLimitDescriptor) (*Limit, error) {
	o := d.Limit
	l := &Limit{
		// One name per domain (in metrics and the RateLimit headers), not
		// the descriptor's keys and values: those are the client's, and a
		// name per value would grow the metrics without bound. The bucket
		// is still the descriptor's own (bucketKey).
		Path:            domain + OverrideSuffix,
		RequestsPerUnit: o.RequestsPerUnit,
		Unit:            rlsv3.RateLimitResponse_RateLimit_Unit(o.Unit),
		UnitMultiplier:  o.GetUnitMultiplier().GetValue(),
	}
	if _, ok := units[l.Unit]; !ok {
		return nil, fmt.Errorf("%w %v", errUnit, o.Unit)
	}
	if err := newLimit(l, 0, "", false); err != nil { // a client's own limit is never leased
		return nil, err
	}
	return l, nil
}
