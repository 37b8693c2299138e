package envoy

import (
	"math"
	"strconv"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/driplimit/drip"
	"github.com/driplimit/drip/engine"
	"github.com/driplimit/drip/engine/retryafter"
)

// respond builds the response: the overall code, one status per
// descriptor, and the RateLimit headers (as the middleware writes them) for
// the enforced descriptors.
func respond(items []item, allowed bool) *rlsv3.RateLimitResponse {
	resp := &rlsv3.RateLimitResponse{
		OverallCode: rlsv3.RateLimitResponse_OK,
		Statuses:    make([]*rlsv3.RateLimitResponse_DescriptorStatus, len(items)),
	}
	if !allowed {
		resp.OverallCode = rlsv3.RateLimitResponse_OVER_LIMIT
	}
	var top, fallback *item
	for i := range items {
		it := &items[i]
		st := &rlsv3.RateLimitResponse_DescriptorStatus{Code: rlsv3.RateLimitResponse_OK}
		resp.Statuses[i] = st
		switch it.kind {
		case none:
			continue
		case unlimited:
			st.LimitRemaining = math.MaxUint32
			continue
		}
		st.CurrentLimit = &rlsv3.RateLimitResponse_RateLimit{
			Name:            it.limit.Name,
			RequestsPerUnit: it.limit.RequestsPerUnit,
			Unit:            it.limit.Unit,
		}
		if it.limit.UnitMultiplier > 1 {
			st.CurrentLimit.UnitMultiplier = wrapperspb.UInt32(it.limit.UnitMultiplier)
		}
		if it.kind == blocked {
			if !it.limit.Shadow {
				st.Code = rlsv3.RateLimitResponse_OVER_LIMIT
			}
			continue
		}
		if !it.step.Decided { // cost > burst: never allowed, nothing asked
			if it.kind == enforce {
				st.Code = rlsv3.RateLimitResponse_OVER_LIMIT
			}
			continue
		}
		st.LimitRemaining = remaining(it)
		if it.step.Decision.Allowed {
			st.DurationUntilReset = durationpb.New(it.step.Decision.ResetAfter)
		} else {
			st.DurationUntilReset = durationpb.New(it.step.Decision.RetryAfter)
			if it.kind == enforce {
				st.Code = rlsv3.RateLimitResponse_OVER_LIMIT
			}
		}
		if it.kind != enforce {
			continue
		}
		if !allowed {
			if !it.step.Decision.Allowed && (top == nil || engine.Tighter(it.step.Decision, top.step.Decision, true)) {
				top = it
			}
			if it.step.Decision.Allowed && (fallback == nil || it.step.Decision.Remaining < fallback.step.Decision.Remaining) {
				fallback = it
			}
		} else if top == nil || engine.Tighter(it.step.Decision, top.step.Decision, false) {
			top = it
		}
	}
	if top == nil {
		// Denied only by a limit of 0 or a cost above a burst, which no
		// wait cures: the headers still describe the buckets, without
		// Retry-After.
		top = fallback
	}
	if top != nil {
		resp.ResponseHeadersToAdd = headers(items, top, allowed)
	}
	return resp
}

// remaining is the whole tokens left in a descriptor's bucket, as the
// request left it: for an allowed descriptor of a denied request (so not
// taken), what it had before (engine.BeforeTake).
func remaining(it *item) uint32 {
	r := it.step.Decision.Remaining
	if it.step.Decision.Allowed && !it.step.Applied && it.kind != refund {
		r = engine.BeforeTake(it.step.Decision, it.limit.Limit, it.key, it.step.Taken).Remaining
	}
	return uint32(min(r, math.MaxUint32))
}

// headers are the engine's RateLimit headers (and Retry-After on a
// denial) for the enforced descriptors that were decided; the single-value
// ones describe top: on a denial the denying descriptor with the longest
// wait, else the one with the fewest tokens left.
func headers(items []item, top *item, allowed bool) []*corev3.HeaderValue {
	var retry int64
	if !allowed {
		var wait time.Duration
		for i := range items {
			if it := &items[i]; it.kind == enforce && it.step.Decided && !it.step.Decision.Allowed {
				wait = max(wait, it.step.Decision.RetryAfter)
			}
		}
		// envoyproxy/ratelimit's config has no place for it: the default.
		retry = retryafter.Default.Seconds(top.key, wait)
	}
	field := func(it *item) engine.Field {
		f := engine.Field{Policy: it.limit.policy, Name: it.limit.qname, Remaining: int64(remaining(it)), T: drip.CeilSeconds(it.step.Decision.ResetAfter)}
		if !allowed && !it.step.Decision.Allowed && retry > 0 {
			f.T = retry
		}
		return f
	}
	var fs []engine.Field
	for i := range items {
		if it := &items[i]; it.kind == enforce && it.step.Decided {
			fs = append(fs, field(it))
		}
	}
	f := engine.MakeFields(fs, field(top), engine.Burst(top.limit.Limit), retry)
	h := []*corev3.HeaderValue{
		{Key: "RateLimit-Policy", Value: f.Policy},
		{Key: "RateLimit", Value: f.RateLimit},
		{Key: "RateLimit-Limit", Value: f.Limit},
		{Key: "RateLimit-Remaining", Value: f.Remaining},
		{Key: "RateLimit-Reset", Value: f.Reset},
	}
	if f.RetryAfter > 0 {
		h = append(h, &corev3.HeaderValue{Key: "Retry-After", Value: strconv.FormatInt(f.RetryAfter, 10)})
	}
	return h
}
