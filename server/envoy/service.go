// Package envoy is drip's Envoy rate limit service:
// envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit over gRPC,
// so that Envoy and Istio can use drip in place of envoyproxy/ratelimit,
// with token buckets in any drip.Store.
//
// Limits come from envoyproxy/ratelimit's YAML configuration, unchanged
// (Parse, Load): a domain per file, nested descriptors of key and optional
// value, rate_limit {unit, requests_per_unit}, unlimited, shadow_mode,
// quota_mode, name and replaces, share_threshold, metadata, and wildcards
// ('*' anywhere in a value, as often as wanted); its environment variables
// are read by OptionsFromEnv and RuntimeDir. A descriptor is matched
// exactly as envoyproxy/ratelimit matches it (see Config.Match), and a
// limit of requests_per_unit per unit becomes a token bucket of that rate
// with a burst of requests_per_unit; drip's own "burst" (and "algorithm:
// fixed_window") may stand beside them.
//
// The main behaviour that differs: envoyproxy/ratelimit counts requests in
// fixed windows (all requests_per_unit are available again at the start
// of each second, minute, ...), while drip refills continuously (one
// request every unit/requests_per_unit), unless a limit says "algorithm:
// fixed_window", or DRIP_ENVOY_ALGORITHM=fixed_window (Options.Algorithm)
// does for every limit without its own. So a client that spent its burst
// gets its next request after 1/requests_per_unit of the unit instead of
// at the window's end, and can never get 2 x requests_per_unit across a
// window boundary.
// Denied requests take nothing, and a request's descriptors are taken all
// or nothing: if one is over its limit, none is charged. quota_mode and
// metadata are loaded but not yet acted on (README's Envoy section).
package envoy

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/driplimit/drip"
)

// Limits of one request, so that a bad client cannot make a request
// arbitrarily expensive.
const (
	MaxDescriptors = 64
	MaxEntries     = 32
	maxCost        = 1e12
)

// Service implements RateLimitServiceServer over a drip.Store. It is safe
// for concurrent use; Swap replaces its configuration atomically.
type Service struct {
	rlsv3.UnimplementedRateLimitServiceServer

	store   drip.Store
	cfg     atomic.Pointer[Config]
	timeout time.Duration
	now     func() time.Time
	log     *slog.Logger
	obs     Observer
}

// Option configures a Service.
type Option func(*Service)

// WithTimeout bounds each store call (default: none beyond the caller's
// deadline; Envoy's own is 20ms by default).
func WithTimeout(d time.Duration) Option { return func(s *Service) { s.timeout = d } }

// WithClock decides at the times now returns instead of on the store's
// clock (for tests).
func WithClock(now func() time.Time) Option { return func(s *Service) { s.now = now } }

// WithLogger sets the logger of store errors (default slog.Default()).
func WithLogger(l *slog.Logger) Option { return func(s *Service) { s.log = l } }

// NewService returns a service deciding with cfg (nil: no domain, every
// request OK) on store.
func NewService(store drip.Store, cfg *Config, opts ...Option) *Service {
	// On a store that cannot take a call's descriptors in one step (Redis
	// Cluster across hash slots), take them one by one, refunding on a
	// denial: drip.Separately.
	s := &Service{store: drip.Separately{Store: store}, log: slog.Default()}
	for _, o := range opts {
		o(s)
	}
	s.Swap(cfg)
	return s
}

// Swap replaces the configuration: calls already deciding finish on the
// old one. Buckets are keyed by domain and descriptor, so they keep their
// state.
func (s *Service) Swap(cfg *Config) {
	if cfg == nil {
		cfg = &Config{}
	}
	s.cfg.Store(cfg)
}

// Config returns the configuration in force.
func (s *Service) Config() *Config { return s.cfg.Load() }

// kind is what a descriptor of a request gets.
type kind uint8

const (
	none      kind = iota // no limit: OK
	unlimited             // unlimited: OK, remaining MaxUint32
	blocked               // requests_per_unit 0: always over the limit
	enforce               // taken from a bucket
	shadow                // decided on a bucket, never denies
	refund                // is_negative_hits: given back to a bucket
)

// item is one descriptor of a request on its way to a decision.
type item struct {
	kind  kind
	limit *Limit
	key   string
	cost  float64
	// taken is the cost its store request was decided at: the costs of
	// every descriptor of its bucket, added.
	taken float64
	// req is the index of its store request in its group; several
	// descriptors with one key share one request (their costs added).
	req int
	d   drip.Decision
	// applied reports whether the group's step was applied (a take whose
	// whole was allowed, or any refund).
	applied bool
	decided bool
	failed  bool // a shadow descriptor whose store call failed
}

// ShouldRateLimit decides one request of Envoy's rate limit filter.
func (s *Service) ShouldRateLimit(ctx context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	if err := validate(req); err != nil {
		return nil, err
	}
	cfg := s.cfg.Load()
	items := make([]item, len(req.Descriptors))
	replacing := map[string]bool{}
	for i, d := range req.Descriptors {
		it := &items[i]
		cost := float64(max(req.HitsAddend, 1))
		if d.HitsAddend != nil {
			cost = float64(d.HitsAddend.GetValue())
		}
		it.cost = cost
		var m match
		if d.Limit != nil {
			if cfg.domains[req.Domain] != nil {
				l, err := override(req.Domain, d)
				if err != nil {
					return nil, status.Errorf(codes.InvalidArgument, "descriptors[%d].limit: %v", i, err)
				}
				m.limit = l
			}
		} else {
			m = cfg.match(req.Domain, d.Entries)
		}
		it.limit = m.limit
		switch l := m.limit; {
		case l == nil:
			continue
		case l.Unlimited:
			it.kind = unlimited
		case l.blocks():
			it.kind = blocked
		case d.IsNegativeHits:
			it.kind = refund
		case l.Shadow:
			it.kind = shadow
		default:
			it.kind = enforce
		}
		for _, r := range m.limit.Replaces {
			replacing[r] = true
		}
		if it.kind >= enforce {
			it.key = bucketKey(req.Domain, d.Entries, m.shared)
		}
	}
	if len(replacing) > 0 {
		for i := range items {
			it := &items[i]
			// An unlimited descriptor stays unlimited when replaced, as in
			// envoyproxy/ratelimit (it is set aside as unlimited before
			// replaces apply).
			if it.kind != unlimited && it.limit != nil && it.limit.Name != "" && replacing[it.limit.Name] {
				it.kind, it.limit = none, nil
			}
		}
	}

	// cost > burst can never be allowed: such a descriptor is over the
	// limit without asking the store, and so is the request.
	denied := false
	for i := range items {
		it := &items[i]
		if (it.kind == blocked && !it.limit.Shadow) || (it.kind == enforce && it.never()) {
			denied = true
		}
	}
	// Refunds first, so that a failing store fails the call before
	// anything is taken; shadow descriptors last, and their failure
	// changes no answer.
	if err := s.run(ctx, items, refund, false); err != nil {
		s.observe(items, err)
		return nil, err
	}
	if err := s.run(ctx, items, enforce, denied); err != nil {
		s.observe(items, err)
		return nil, err
	}
	allowed := !denied
	for i := range items {
		if it := &items[i]; it.kind == enforce && it.decided && !it.d.Allowed {
			allowed = false
		}
	}
	if err := s.run(ctx, items, shadow, !allowed); err != nil {
		for i := range items {
			if items[i].kind == shadow {
				items[i].failed = true
			}
		}
	}
	s.observe(items, nil)
	return respond(items, allowed), nil
}

// Observer hears, for each descriptor of a call that met a limit, the
// limit's name (rate_limit.name, else its place in the config, e.g.
// "messaging.to_number"), whether it is in shadow mode, and the outcome:
// "allowed", "denied", "not_taken" (allowed on its own, but the call was
// denied by another descriptor, so nothing was taken), "refunded",
// "unlimited" or "error" (the store failed).
type Observer func(limit string, shadow bool, outcome string)

// WithObserver sets the observer of decisions (metrics).
func WithObserver(o Observer) Option { return func(s *Service) { s.obs = o } }

// Outcomes an Observer hears.
const (
	OutcomeAllowed   = "allowed"
	OutcomeDenied    = "denied"
	OutcomeNotTaken  = "not_taken"
	OutcomeRefunded  = "refunded"
	OutcomeUnlimited = "unlimited"
	OutcomeError     = "error"
)

func (s *Service) observe(items []item, err error) {
	if s.obs == nil {
		return
	}
	for i := range items {
		it := &items[i]
		var out string
		switch {
		case it.kind == none:
			continue
		case it.kind == unlimited:
			out = OutcomeUnlimited
		case err != nil || it.failed:
			out = OutcomeError
		case it.kind == blocked || !it.decided || !it.d.Allowed:
			out = OutcomeDenied
		case it.kind == refund:
			out = OutcomeRefunded
		case !it.applied:
			out = OutcomeNotTaken
		default:
			out = OutcomeAllowed
		}
		name := it.limit.Name
		if name == "" {
			name = it.limit.Path
		}
		s.obs(name, it.limit.Shadow, out)
	}
}

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
		if b := burstOf(reqs[j].Limit); reqs[j].Cost > b {
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
	if dl, ok := ctx.Deadline(); s.timeout > 0 && (!ok || time.Until(dl) > s.timeout) {
		// The caller's own deadline (Envoy sends its 20ms) is usually the
		// shorter, and costs no timer.
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, s.timeout)
		defer cancel()
	}
	var at time.Time
	if s.now != nil {
		at = s.now()
	}
	m, err := s.store.ApplyMulti(ctx, op, at, reqs)
	if err != nil {
		s.log.Error("envoy ratelimit: store failed", "err", err.Error())
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
func (it *item) never() bool { return it.cost > it.limit.burst() }

func burstOf(l drip.Limit) float64 {
	if l.Burst == 0 {
		return l.Rate
	}
	return l.Burst
}

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
		if !it.decided { // cost > burst: never allowed, nothing asked
			if it.kind == enforce {
				st.Code = rlsv3.RateLimitResponse_OVER_LIMIT
			}
			continue
		}
		st.LimitRemaining = remaining(it)
		if it.d.Allowed {
			st.DurationUntilReset = durationpb.New(it.d.ResetAfter)
		} else {
			st.DurationUntilReset = durationpb.New(it.d.RetryAfter)
			if it.kind == enforce {
				st.Code = rlsv3.RateLimitResponse_OVER_LIMIT
			}
		}
		if it.kind != enforce {
			continue
		}
		if !allowed {
			if !it.d.Allowed && (top == nil || it.d.RetryAfter > top.d.RetryAfter) {
				top = it
			}
			if it.d.Allowed && (fallback == nil || it.d.Remaining < fallback.d.Remaining) {
				fallback = it
			}
		} else if top == nil || it.d.Remaining < top.d.Remaining ||
			(it.d.Remaining == top.d.Remaining && it.d.ResetAfter > top.d.ResetAfter) {
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
// taken), what it had before.
func remaining(it *item) uint32 {
	r := it.d.Remaining
	if it.d.Allowed && !it.applied && it.kind != refund {
		micro := int64(math.Round(it.d.Tokens*drip.Micro)) + int64(math.Round(it.taken*drip.Micro))
		r = max(0, micro/drip.Micro)
	}
	return uint32(min(r, math.MaxUint32))
}

// headers are the middleware's RateLimit headers (and Retry-After on a denial)
// for the enforced descriptors that were decided; the single-value ones
// describe top: on a denial the denying descriptor with the longest wait,
// else the one with the fewest tokens left.
func headers(items []item, top *item, allowed bool) []*corev3.HeaderValue {
	var retry int64
	if !allowed {
		var wait time.Duration
		for i := range items {
			if it := &items[i]; it.kind == enforce && it.decided && !it.d.Allowed {
				wait = max(wait, it.d.RetryAfter)
			}
		}
		// envoyproxy/ratelimit's config has no place for it: the default.
		retry = drip.DefaultRetryJitter.Seconds(top.key, wait)
	}
	t := func(it *item) int64 {
		if !allowed && !it.d.Allowed && retry > 0 {
			return retry
		}
		return drip.CeilSeconds(it.d.ResetAfter)
	}
	var policy, limit []byte
	for i := range items {
		it := &items[i]
		if it.kind != enforce || !it.decided {
			continue
		}
		if len(policy) > 0 {
			policy = append(policy, ", "...)
			limit = append(limit, ", "...)
		}
		policy = append(policy, it.limit.policy...)
		limit = append(limit, it.limit.qname...)
		limit = append(limit, ";r="...)
		limit = strconv.AppendUint(limit, uint64(remaining(it)), 10)
		limit = append(limit, ";t="...)
		limit = strconv.AppendInt(limit, t(it), 10)
	}
	h := []*corev3.HeaderValue{
		{Key: "RateLimit-Policy", Value: string(policy)},
		{Key: "RateLimit", Value: string(limit)},
		{Key: "RateLimit-Limit", Value: top.limit.burstText},
		{Key: "RateLimit-Remaining", Value: strconv.FormatUint(uint64(remaining(top)), 10)},
		{Key: "RateLimit-Reset", Value: strconv.FormatInt(t(top), 10)},
	}
	if retry > 0 {
		h = append(h, &corev3.HeaderValue{Key: "Retry-After", Value: strconv.FormatInt(retry, 10)})
	}
	return h
}
