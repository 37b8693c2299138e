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

	"github.com/driplimit/drip"
	"github.com/driplimit/drip/engine"
	"github.com/driplimit/drip/internal/seconds"
	"github.com/driplimit/drip/rules"
)

// respond builds the response to req: the overall code, one status per
// descriptor, the headers opts.Headers asks for (by default the RateLimit
// headers, as the middleware writes them, of the enforced descriptors), and
// the dynamic metadata when opts.DynamicMetadata.
func respond(req *rlsv3.RateLimitRequest, items []item, allowed bool, opts *Options) *rlsv3.RateLimitResponse {
	resp := &rlsv3.RateLimitResponse{
		OverallCode: rlsv3.RateLimitResponse_OK,
		Statuses:    make([]*rlsv3.RateLimitResponse_DescriptorStatus, len(items)),
	}
	if !allowed {
		resp.OverallCode = rlsv3.RateLimitResponse_OVER_LIMIT
	}
	var top, fallback, shut *item
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
			if !allowed && !it.limit.Shadow && shut == nil {
				shut = it
			}
			continue
		}
		if !it.step.Decided || (it.kind == enforce && it.step.Never()) {
			// cost > burst: never allowed, and over the limit with
			// nothing remaining, as envoyproxy/ratelimit says. Peeked
			// when the request was denied (run): then the headers
			// describe its bucket, unless a denial a wait cures does.
			if it.kind == enforce {
				st.Code = rlsv3.RateLimitResponse_OVER_LIMIT
			}
			if it.kind == enforce && it.step.Decided && top == nil {
				top = it
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
		// Denied only by a limit of 0 (or by quota descriptors that can
		// never pass, set aside unasked), which no wait cures: no
		// Retry-After; the single-value headers describe the limit of 0
		// (a quota of 0, none remaining, no reset), else the buckets.
		top = fallback
		if shut != nil {
			top = shut
		}
	}
	switch opts.Headers.Mode {
	case HeadersEnvoy:
		resp.ResponseHeadersToAdd = envoyHeaders(opts.Headers, items, resp.Statuses)
	case HeadersNone:
	default:
		if top != nil {
			resp.ResponseHeadersToAdd = headers(items, top, allowed)
		}
	}
	if opts.DynamicMetadata {
		resp.DynamicMetadata = dynamicMetadata(req, items, resp.Statuses)
	}
	return resp
}

// wait is how long a denied request waits before it may be allowed: the
// longest wait of its descriptors over their limit outside quota mode and,
// when none of its quota descriptors is within its limit, the shortest
// wait of theirs (those that no wait cures aside).
func wait(items []item) time.Duration {
	var w, quota time.Duration
	quotas, within, waits := 0, false, false
	for i := range items {
		it := &items[i]
		denied := it.kind == enforce && it.step.Decided && !it.step.Decision.Allowed
		if !it.quota {
			if denied {
				w = max(w, it.step.Decision.RetryAfter)
			}
			continue
		}
		quotas++
		switch {
		case denied:
			if !waits || it.step.Decision.RetryAfter < quota {
				quota, waits = it.step.Decision.RetryAfter, true
			}
		case it.kind == enforce && it.step.Decided:
			within = true // allowed on its own
		}
	}
	if quotas > 0 && !within {
		w = max(w, quota)
	}
	return w
}

// remaining is the whole tokens left in a descriptor's bucket, as the
// request left it (current).
func remaining(it *item) uint32 {
	return uint32(min(current(it).Remaining, math.MaxUint32))
}

// current is a descriptor's bucket as the request left it: for an allowed
// descriptor of a denied request (so not taken), as it was before
// (engine.BeforeTake).
func current(it *item) drip.Decision {
	if it.step.Decision.Allowed && !it.step.Changed && it.kind != refund {
		return engine.BeforeTake(it.step.Decision, it.limit.Limit, it.key, it.step.Taken)
	}
	return it.step.Decision
}

// headers are the engine's RateLimit headers (and Retry-After on a
// denial) for the enforced descriptors that were decided, and those whose
// limit is 0 (a quota of 0, with no window); the single-value ones
// describe top: on a denial the denying descriptor with the longest wait
// (or a limit of 0, when no wait cures the denial), else the one with the
// fewest tokens left.
func headers(items []item, top *item, allowed bool) []*corev3.HeaderValue {
	var retry int64
	if !allowed && top.kind != blocked {
		// envoyproxy/ratelimit's config has no place for it: the default.
		retry = rules.DefaultJitter.Seconds(top.key, wait(items))
	}
	field := func(it *item) engine.Field {
		f := engine.Field{Policy: it.limit.policy, Name: it.limit.qname}
		switch {
		case it.kind == blocked:
			f.NoT = true
		case !allowed && !it.step.Decision.Allowed && retry > 0:
			f.Remaining, f.T = int64(remaining(it)), retry
		default:
			f.Remaining, f.T = int64(remaining(it)), seconds.Ceil(current(it).ResetAfter)
		}
		return f
	}
	var fs []engine.Field
	for i := range items {
		it := &items[i]
		if (it.kind == enforce && it.step.Decided) || (it.kind == blocked && !it.limit.Shadow) {
			fs = append(fs, field(it))
		}
	}
	f := engine.MakeFields(fs, field(top), top.limit.quota, retry)
	h := make([]*corev3.HeaderValue, 0, 6)
	for name, v := range f.All() {
		h = append(h, &corev3.HeaderValue{Key: name, Value: v})
	}
	return h
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
