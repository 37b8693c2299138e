package envoy

import (
	"context"
	"errors"
	"fmt"
	"strings"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/driplimit/drip"
	"github.com/driplimit/drip/engine"
)

// run decides the items of kind k in one store call: a take (all or
// nothing), a peek when peek is set (the request is denied anyway), or a
// refund. Items whose cost exceeds the burst are left undecided: they can
// never be allowed.
func (s *Service) run(ctx context.Context, items []item, k kind, peek bool) error {
	var reqs []drip.Request
	var byKey map[string]int // beyond a few requests; a scan below
	for i := range items {
		it := &items[i]
		if it.kind != k || (k != refund && it.never()) {
			continue
		}
		j := -1
		if byKey != nil {
			if x, ok := byKey[it.key]; ok {
				j = x
			}
		} else {
			for x := range reqs {
				if reqs[x].Key == it.key {
					j = x
					break
				}
			}
		}
		if j >= 0 {
			it.req = j
			reqs[j].Cost += it.cost
			continue
		}
		if reqs == nil {
			reqs = make([]drip.Request, 0, len(items)-i)
		}
		it.req = len(reqs)
		reqs = append(reqs, drip.Request{Key: it.key, Limit: it.limit.Limit, Cost: it.cost})
		if byKey == nil && len(reqs) > 8 {
			byKey = make(map[string]int, len(items))
			for x, r := range reqs {
				byKey[r.Key] = x
			}
		} else if byKey != nil {
			byKey[it.key] = it.req
		}
	}
	if len(reqs) == 0 {
		return nil
	}
	op := drip.OpTake
	switch {
	case k == refund:
		op = drip.OpRefund
	case peek:
		op = drip.OpPeek
	}
	// Descriptors of one bucket may add up past its burst: such a take can
	// never be allowed, so it is only peeked, at the burst (a refund past
	// the burst just fills the bucket).
	var over []bool
	for j := range reqs {
		if b := engine.Burst(reqs[j].Limit); reqs[j].Cost > b {
			if over == nil {
				over = make([]bool, len(reqs))
			}
			over[j] = true
			reqs[j].Cost = b
			if op == drip.OpTake {
				op = drip.OpPeek
			}
		}
	}
	m, err := s.eng.Apply(ctx, op, reqs)
	if err != nil {
		code := codes.Unavailable
		switch {
		case errors.Is(err, context.DeadlineExceeded):
			code = codes.DeadlineExceeded
		case errors.Is(err, context.Canceled):
			code = codes.Canceled
		}
		return status.Errorf(code, "rate limit store: %v", err)
	}
	for i := range items {
		it := &items[i]
		if it.kind != k || (k != refund && it.never()) {
			continue
		}
		it.d, it.decided, it.taken = m.Decisions[it.req], true, reqs[it.req].Cost
		it.applied = op == drip.OpRefund || (op == drip.OpTake && m.Allowed)
		if over != nil && over[it.req] && op == drip.OpPeek {
			it.d.Allowed = false
		}
	}
	return nil
}

// never reports whether the item's cost exceeds its burst, so that it can
// never be allowed.
func (it *item) never() bool { return it.cost > engine.Burst(it.limit.Limit) }

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

// override is the limit a descriptor's own "limit" sets.
func override(domain string, d *ratelimitv3.RateLimitDescriptor) (*Limit, error) {
	o := d.Limit
	var b strings.Builder
	b.WriteString(domain)
	for _, e := range d.Entries {
		b.WriteByte('.')
		b.WriteString(e.Key)
		if e.Value != "" {
			b.WriteByte('_')
			b.WriteString(e.Value)
		}
	}
	l := &Limit{
		Path:            b.String(),
		RequestsPerUnit: o.RequestsPerUnit,
		Unit:            rlsv3.RateLimitResponse_RateLimit_Unit(o.Unit),
		UnitMultiplier:  o.GetUnitMultiplier().GetValue(),
	}
	if _, ok := units[l.Unit]; !ok {
		return nil, fmt.Errorf("%w %v", errUnit, o.Unit)
	}
	if err := newLimit(l, 0, ""); err != nil {
		return nil, err
	}
	return l, nil
}
