package envoy

import (
	"fmt"
	"math"
	"strconv"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/driplimit/drip/engine"
	"github.com/driplimit/drip/internal/seconds"
)

// respond builds the response to req: the overall code, one status per
// descriptor, the headers opts.Headers asks for (by default the RateLimit
// headers, as the middleware writes them, of the enforced descriptors), and
// the dynamic metadata when opts.DynamicMetadata.
func respond(req *rlsv3.RateLimitRequest, items []item, out *engine.Outcome, opts *Options) *rlsv3.RateLimitResponse {
	allowed := out.Allowed
	resp := &rlsv3.RateLimitResponse{
		OverallCode: rlsv3.RateLimitResponse_OK,
		Statuses:    make([]*rlsv3.RateLimitResponse_DescriptorStatus, len(items)),
	}
	if !allowed {
		resp.OverallCode = rlsv3.RateLimitResponse_OVER_LIMIT
	}
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
			if !it.limit.Shadow || it.limit.globalShadow {
				st.Code = rlsv3.RateLimitResponse_OVER_LIMIT
			}
			continue
		}
		if !it.step.Decided || (it.kind == enforce && it.step.Never()) {
			// cost > burst: never allowed, and over the limit with
			// nothing remaining, as envoyproxy/ratelimit says.
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
			if it.kind == enforce || (it.kind == shadow && it.limit.globalShadow) {
				st.Code = rlsv3.RateLimitResponse_OVER_LIMIT
			}
		}
	}
	switch opts.Headers.Mode {
	case HeadersEnvoy:
		resp.ResponseHeadersToAdd = envoyHeaders(opts.Headers, items, resp.Statuses)
	case HeadersNone:
	default:
		for name, v := range out.Fields().All() {
			if resp.ResponseHeadersToAdd == nil {
				resp.ResponseHeadersToAdd = make([]*corev3.HeaderValue, 0, 6)
			}
			resp.ResponseHeadersToAdd = append(resp.ResponseHeadersToAdd, &corev3.HeaderValue{Key: name, Value: v})
		}
	}
	if opts.DynamicMetadata {
		resp.DynamicMetadata = dynamicMetadata(req, items, resp.Statuses)
	}
	return resp
}

// remaining is the whole tokens left in a descriptor's bucket, as the
// request left it (engine.Applied.Current).
func remaining(it *item) uint32 {
	return uint32(min(it.step.Current().Remaining, math.MaxUint32))
}

// envoyHeaders are envoyproxy/ratelimit's three headers (HeadersEnvoy),
// from the status of one descriptor: the last one over its limit outside
// quota mode, else the first with the fewest requests remaining; none when
// no descriptor met a limit.
func envoyHeaders(h Headers, items []item, statuses []*rlsv3.RateLimitResponse_DescriptorStatus) []*corev3.HeaderValue {
	var pick *rlsv3.RateLimitResponse_DescriptorStatus
	var l *Limit
	least := uint32(math.MaxUint32)
	for i, st := range statuses {
		if st.CurrentLimit != nil && st.LimitRemaining < least {
			pick, l, least = st, items[i].limit, st.LimitRemaining
		}
		if st.Code == rlsv3.RateLimitResponse_OVER_LIMIT && !items[i].quota {
			pick, l, least = st, items[i].limit, 0
		}
	}
	if pick == nil {
		return nil
	}
	var reset int64
	if d := pick.DurationUntilReset; d != nil {
		reset = seconds.Ceil(d.AsDuration())
	} else {
		// A limit of 0, or a cost above the burst: no wait cures it; one
		// unit, as envoyproxy/ratelimit would say at most.
		reset = seconds.Ceil(units[l.Unit] * time.Duration(l.UnitMultiplier))
	}
	limit, remaining, resetName := h.names()
	return []*corev3.HeaderValue{
		{Key: limit, Value: strconv.FormatUint(uint64(pick.CurrentLimit.RequestsPerUnit), 10)},
		{Key: remaining, Value: strconv.FormatUint(uint64(pick.LimitRemaining), 10)},
		{Key: resetName, Value: strconv.FormatInt(reset, 10)},
	}
}

// dynamicMetadata is envoyproxy/ratelimit's dynamic metadata of a
// response (Options.DynamicMetadata): "domain"; "descriptors", each with
// its "entries" as "key=value" strings, its own "limit" (in protobuf text
// form) and "hitsAddend" when it has them; the request's "hitsAddend" when
// not 0; and "metadata", the metadata of the limits of the descriptors not
// over their limit (unlimited ones aside), merged in descriptor order: the
// first value of a key wins, and two mappings under one key are merged
// alike.
func dynamicMetadata(req *rlsv3.RateLimitRequest, items []item, statuses []*rlsv3.RateLimitResponse_DescriptorStatus) *structpb.Struct {
	descs := make([]*structpb.Value, len(req.Descriptors))
	for i, d := range req.Descriptors {
		entries := make([]*structpb.Value, len(d.Entries))
		for j, e := range d.Entries {
			entries[j] = structpb.NewStringValue(e.Key + "=" + e.Value)
		}
		f := map[string]*structpb.Value{"entries": structpb.NewListValue(&structpb.ListValue{Values: entries})}
		if o := d.Limit; o != nil {
			f["limit"] = structpb.NewStringValue(fmt.Sprintf("requests_per_unit:%d unit:%s", o.RequestsPerUnit, o.Unit))
		}
		if d.HitsAddend != nil {
			f["hitsAddend"] = structpb.NewNumberValue(float64(d.HitsAddend.GetValue()))
		}
		descs[i] = structpb.NewStructValue(&structpb.Struct{Fields: f})
	}
	out := map[string]*structpb.Value{
		"domain":      structpb.NewStringValue(req.Domain),
		"descriptors": structpb.NewListValue(&structpb.ListValue{Values: descs}),
	}
	if req.HitsAddend != 0 {
		out["hitsAddend"] = structpb.NewNumberValue(float64(req.HitsAddend))
	}
	merged := &structpb.Struct{Fields: map[string]*structpb.Value{}}
	for i := range items {
		it := &items[i]
		if it.kind == unlimited || it.limit == nil || it.limit.Metadata == nil || statuses[i].Code == rlsv3.RateLimitResponse_OVER_LIMIT {
			continue
		}
		mergeMetadata(merged, it.limit.Metadata)
	}
	if len(merged.Fields) > 0 {
		out["metadata"] = structpb.NewStructValue(merged)
	}
	return &structpb.Struct{Fields: out}
}

// mergeMetadata adds src's fields to dst's (which it owns: src, the
// config's, is copied, never changed): a key dst has keeps its value,
// unless both are mappings, which are merged the same way.
func mergeMetadata(dst, src *structpb.Struct) {
	for k, v := range src.Fields {
		have, ok := dst.Fields[k]
		if !ok {
			dst.Fields[k] = proto.Clone(v).(*structpb.Value)
			continue
		}
		if a, b := have.GetStructValue(), v.GetStructValue(); a != nil && b != nil {
			mergeMetadata(a, b)
		}
	}
}
