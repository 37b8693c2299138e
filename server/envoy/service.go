// Package envoy is drip's Envoy rate limit service:
// envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit over gRPC,
// so that Envoy and Istio can use drip in place of envoyproxy/ratelimit,
// with token buckets in any store.Store.
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
// or nothing: if one is over its limit, none is charged (a quota_mode
// descriptor over its limit is set aside and the others taken, when the
// request is allowed without it). Options, from envoyproxy/ratelimit's
// variables, also choose global shadow or quota mode, dynamic metadata
// and the response headers.
package envoy

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/driplimit/drip/engine"
	"github.com/driplimit/drip/internal/door/local"
	"github.com/driplimit/drip/rules"
	"github.com/driplimit/drip/store"
)

// Limits of one request, so that a bad client cannot make a request
// arbitrarily expensive.
const (
	MaxDescriptors = 64
	MaxEntries     = 32
	maxCost        = 1e12
)

// Service implements RateLimitServiceServer over a store.Store, through
// drip's decision engine (package engine): each store call goes through
// the engine's circuit breaker, under its deadline, and is observed; the
// RateLimit headers and Retry-After are the engine's. It is safe for
// concurrent use; Swap replaces its configuration atomically.
type Service struct {
	rlsv3.UnimplementedRateLimitServiceServer

	eng  *engine.Engine
	obs  engine.Observer    // of decisions
	keys engine.KeyObserver // of their keys; nil: none
	cfg  atomic.Pointer[Config]
}

// Option configures a Service: it is an engine option (engine.WithTimeout,
// engine.WithClock, engine.WithLogger, engine.WithObserver,
// engine.WithKeys, ...). With engine.Shared the service decides with an
// engine shared by other front doors, and the other options are that
// engine's.
type Option = engine.Option

// WithTimeout is engine.WithTimeout(d).
//
// Deprecated: use engine.WithTimeout.
func WithTimeout(d time.Duration) Option { return engine.WithTimeout(d) }

// WithClock is engine.WithClock(now).
//
// Deprecated: use engine.WithClock.
func WithClock(now func() time.Time) Option { return engine.WithClock(now) }

// WithLogger is engine.WithLogger(l).
//
// Deprecated: use engine.WithLogger.
func WithLogger(l *slog.Logger) Option { return engine.WithLogger(l) }

// WithObserver is engine.WithObserver(obs). Beside engine.Shared, use
// Service.Observe.
//
// Deprecated: use engine.WithObserver.
func WithObserver(obs engine.Observer) Option { return engine.WithObserver(obs) }

// WithKeys is engine.WithKeys(k). Beside engine.Shared, use
// Service.Observe.
//
// Deprecated: use engine.WithKeys.
func WithKeys(k engine.KeyObserver) Option { return engine.WithKeys(k) }

// WithEngine is engine.Shared(e).
//
// Deprecated: use engine.Shared.
func WithEngine(e *engine.Engine) Option { return engine.Shared(e) }

// NewService returns a service deciding with cfg (nil: no domain, every
// request OK) on store.
//
// The engine's observer hears the service's decisions. For each
// descriptor of a call that met a limit it hears Decision with the
// limit's name (rate_limit.name, else its place in the config, e.g.
// "messaging.to_number"). The mode is rules.Shadow for a limit in shadow
// mode, else rules.Enforce. The event is engine.Allowed, Denied,
// NotTaken (allowed, but another descriptor denied the call), Refunded,
// Unlimited or Failed (the store failed). The engine's key observer
// hears Key with the same, and the descriptor's bucket.
func NewService(store store.Store, cfg *Config, opts ...Option) *Service {
	eng := engine.New(store, append([]engine.Option{engine.WithName("envoy ratelimit"), engine.WithLocal(local.New)}, opts...)...)
	s := &Service{eng: eng, obs: eng.Observer(), keys: eng.Keys()}
	s.Swap(cfg)
	return s
}

// Observe makes the service tell its decisions to obs and keys (nil:
// none) instead of its engine's observers, which still hear its store
// calls and the breaker. It is for a service on a shared engine
// (engine.Shared) whose decisions are counted apart. Call it before the
// service answers.
func (s *Service) Observe(obs engine.Observer, keys engine.KeyObserver) {
	if obs == nil {
		obs = engine.NopObserver{}
	}
	s.obs, s.keys = obs, keys
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
	charge                // a SettleKey descriptor: work done, charged into bounded debt
)

// SettleKey marks a descriptor that charges work already done: a
// descriptor whose last entry has this key (any value) is matched without
// that entry, so it meets the same limit and bucket as the descriptor
// without it, and its hits are charged, into debt at most one burst
// (what would pass it is forgiven), never denied. It is
// for Envoy's apply_on_stream_done rate limits, whose call comes when the
// response has ended, with the actual cost as hits_addend; add the entry
// with a generic_key action (descriptor_key: drip_settle). Envoy's request
// carries nothing else that tells that call from the others (a domain,
// descriptors, hits_addend); a limit with Settle instead marks the calls
// that give the descriptor its own hits_addend above 0 as charges.
const SettleKey = "drip_settle"

// item is one descriptor of a request on its way to a decision.
type item struct {
	kind  kind
	limit *Limit
	key   string
	cost  float64
	// step is its limit as the engine applied it (its decision,
	// verdict and event), in the outcome; several descriptors with one
	// key share a bucket (their costs added).
	step *engine.Applied
	// quota marks an enforced (or blocked) descriptor in quota mode.
	quota bool
}

// ShouldRateLimit decides one request of Envoy's rate limit filter.
func (s *Service) ShouldRateLimit(ctx context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	if err := validate(req); err != nil {
		return nil, err
	}
	cfg := s.cfg.Load()
	sc := scratchPool.Get().(*scratch)
	defer sc.put()
	items := sc.take(len(req.Descriptors))
	replacing := map[string]bool{}
	for i, d := range req.Descriptors {
		it := &items[i]
		cost := float64(max(req.HitsAddend, 1))
		if d.HitsAddend != nil {
			cost = float64(d.HitsAddend.GetValue())
		}
		it.cost = cost
		entries, settles := d.Entries, false
		if n := len(entries); n > 1 && entries[n-1].GetKey() == SettleKey {
			entries, settles = entries[:n-1], true
		}
		var m match
		if d.Limit != nil {
			if cfg.domains[req.Domain] != nil {
				l, err := override(req.Domain, d)
				if err != nil {
					return nil, status.Errorf(codes.InvalidArgument, "descriptors[%d].limit: %v", i, err)
				}
				// SHADOW_MODE overrides every answer in envoyproxy/ratelimit,
				// a request's own limits' included.
				l.Shadow, l.globalShadow = cfg.opts.Shadow, cfg.opts.Shadow
				l.prepare()
				m.limit = l
			}
		} else {
			m = cfg.match(req.Domain, entries)
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
		case settles, l.Settle && d.HitsAddend.GetValue() > 0:
			it.kind = charge
		case l.Shadow:
			it.kind = shadow
		default:
			it.kind = enforce
		}
		for _, r := range m.limit.Replaces {
			replacing[r] = true
		}
		if it.kind >= enforce {
			it.key = bucketKey(req.Domain, entries, m.shared)
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

	// The engine decides the descriptors that met a limit: refunds first,
	// then the enforced ones all or nothing (quota mode, limits of 0 and
	// costs above the burst as the engine's Item says), then the shadow
	// ones.
	var buf [4]engine.Applied // the engine copies them: on the stack for a few
	as := buf[:0]
	for i := range items {
		it := &items[i]
		if it.kind < blocked {
			continue
		}
		q := (it.limit.Quota || cfg.opts.Quota) && it.kind != refund && it.kind != charge
		it.quota = q && !it.limit.Shadow
		a := it.limit.applied
		a.Key, a.Cost, a.Mode = it.key, it.cost, mode(it.kind, it.limit.Shadow, q)
		as = append(as, a)
	}
	out := s.eng.DecideItems(ctx, as)
	// Nothing of out outlives the call: the response holds copies, and
	// the items' steps point into it until sc.put clears them.
	defer out.Recycle()
	j := 0
	for i := range items {
		if items[i].kind >= blocked {
			items[i].step = &out.Applied[j]
			j++
		}
	}
	s.observe(items)
	if out.Err != nil {
		return nil, storeError(out.Err)
	}
	return respond(req, items, out, &cfg.opts), nil
}

// mode is the engine's mode of a descriptor of kind k (blocked, enforce,
// shadow, refund or charge; a blocked descriptor's limit is the zero
// Limit, which allows nothing), of a limit in shadow mode or not, in quota
// mode or not.
func mode(k kind, shadowed, quota bool) engine.ItemMode {
	switch {
	case k == refund:
		return engine.Refund
	case k == charge:
		return engine.Charge
	case shadowed && quota:
		return engine.ShadowQuota
	case shadowed:
		return engine.Shadow
	case quota:
		return engine.EnforceQuota
	}
	return engine.Enforce
}

// scratch is a call's items, kept between calls: what a call returns (its
// response, its error) holds nothing of them, nor does what it tells the
// observers (engine.KeyObserver keeps nothing it is shown).
type scratch struct {
	items []item
}

var scratchPool = sync.Pool{New: func() any { return new(scratch) }}

// take returns n zero items.
func (sc *scratch) take(n int) []item {
	if cap(sc.items) < n {
		sc.items = make([]item, n)
	}
	sc.items = sc.items[:n]
	return sc.items
}

// put clears what the call left and keeps sc for the next one, unless it
// grew beyond a common call's size.
func (sc *scratch) put() {
	if cap(sc.items) > 8 {
		return
	}
	clear(sc.items)
	scratchPool.Put(sc)
}

// storeError is the gRPC error of a call whose store failed.
func storeError(err error) error {
	code := codes.Unavailable
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		code = codes.DeadlineExceeded
	case errors.Is(err, context.Canceled):
		code = codes.Canceled
	}
	return status.Errorf(code, "rate limit store: %v", err)
}

// observe reports each descriptor that met a limit to the observer: the
// engine's event of its limit (engine.Unlimited for an unlimited one).
func (s *Service) observe(items []item) {
	obs := s.obs
	for i := range items {
		it := &items[i]
		var out engine.Event
		switch it.kind {
		case none:
			continue
		case unlimited:
			out = engine.Unlimited
		default:
			out = it.step.Event
		}
		mode := rules.Enforce
		if it.limit.Shadow {
			mode = rules.Shadow
		}
		obs.Decision(it.limit.Label(), mode, out)
		if s.keys != nil {
			var k *engine.Item
			if it.step != nil {
				k = &it.step.Item
			} else {
				k = &engine.Item{} // an unlimited descriptor's: no bucket (made only for one)
			}
			s.keys.Key(it.limit.Label(), mode, out, k)
		}
		if it.kind == charge && it.step.Decided {
			// The tokens of the descriptor's bucket (for descriptors
			// that share one, each is told the bucket's charge).
			charged := min(it.step.Taken, it.cost)
			if charged > 0 {
				obs.Tokens(it.limit.Label(), engine.Charged, charged)
			}
			if charged < it.cost {
				obs.Tokens(it.limit.Label(), engine.Forgiven, it.cost-charged)
			}
		}
	}
}
