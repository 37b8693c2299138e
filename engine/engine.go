// Package engine is drip's one decision engine: every front door (the
// net/http middleware, the gRPC interceptors, the gateway, the decision
// API, Envoy's rate limit service) hands it what a request offers and
// writes what it answers.
//
// Given the values a request offers for the rules' limit keys (a Request),
// Decide matches the rules (groups, shadow), makes one all-or-nothing store
// call under a deadline, through a circuit breaker, applies each rule's
// on_error when the store fails (allow, deny, or a local limiter), and
// returns one Outcome: the decision, the rules that decided, the RateLimit
// and RateLimit-Policy field values, Retry-After with jitter, the problem
// details, and the events of the Observer, in one vocabulary (Event).
//
// Front doors that match limits their own way (Envoy's descriptors) use
// the engine's parts: Step (a request's limits in one store call, the one
// Decide makes), Apply (one store call under the deadline, through the
// breaker, observed), Tighter (the limit the single-value headers
// describe), MakeFields (the header values), BeforeTake (the tokens a
// bucket held before a take that was not applied) and the Observer.
//
// The engine is public so that programs can build front doors of their
// own (a key-function middleware, say) that behave as drip's
// do. An Engine is safe for concurrent use.
package engine

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/driplimit/drip"
	"github.com/driplimit/drip/override"
	"github.com/driplimit/drip/rules"
	"github.com/driplimit/drip/store/memstore"
)

// DefaultTimeout is the deadline of each store call, in every front door,
// unless an option or the rules file's store_timeout says otherwise. A
// rate limiter answers before the request it guards: a store slower than
// this is treated as failing, and on_error decides. A store that is a
// drip.InProcess (the memory store) never waits on a server, and its calls
// get no deadline of their own (the caller's context still applies).
const DefaultTimeout = 50 * time.Millisecond

// ErrBreakerOpen is the error of a store call that the circuit breaker
// did not make.
var ErrBreakerOpen = errors.New("circuit breaker open: store not called")

// Engine decides requests with state in a drip.Store. Construct it with
// New; it is safe for concurrent use.
type Engine struct {
	store    drip.Store
	log      *slog.Logger
	obs      Observer
	timeout  time.Duration
	now      func() time.Time // nil: the store's clock
	brk      *breaker
	lastLog  atomic.Int64
	separate bool // WithSeparateTakes
	inproc   bool // the store is a drip.InProcess: its calls get no deadline
	name     string
	ovr      atomic.Pointer[override.Snapshot] // overrides.go
	tracer   trace.Tracer                      // WithTracerProvider; nil: no tracing
	kind     attribute.KeyValue                // drip.store, on every span

	localMu sync.Mutex
	local   *memstore.Store
	closed  bool
}

// Option configures an Engine.
type Option func(*Engine)

// WithLogger sets the logger for store failures and breaker changes
// (default slog.Default()).
func WithLogger(log *slog.Logger) Option { return func(e *Engine) { e.log = log } }

// WithObserver sets the observer of decisions, store calls and the
// breaker.
func WithObserver(o Observer) Option { return func(e *Engine) { e.obs = o } }

// WithTimeout sets the deadline of each store call (default
// DefaultTimeout). A rules file's store_timeout takes precedence.
func WithTimeout(d time.Duration) Option { return func(e *Engine) { e.timeout = d } }

// WithSeparateTakes is for stores that cannot take several keys in one
// atomic step, such as Redis Cluster: every multi-key store call is
// applied one request at a time (drip.Separately with Always), in file
// order, and when a take is denied, those already taken are given back
// (tokens and slots) and the rest are peeked at. Without the option, a
// store that answers a multi-take with drip.ErrNotColocated gets the same
// treatment, after a first attempt. Either way the answers are those of
// one atomic multi-take, and all or nothing holds in the end rather than
// at every instant.
func WithSeparateTakes() Option { return func(e *Engine) { e.separate = true } }

// WithClock makes the engine pass now() as the time of each decision
// (instead of the store's clock), and use it for the circuit breaker.
func WithClock(now func() time.Time) Option { return func(e *Engine) { e.now = now } }

// WithName sets the prefix of the engine's log messages (default
// "drip").
func WithName(name string) Option { return func(e *Engine) { e.name = name } }

// New returns an Engine with state in store.
func New(store drip.Store, opts ...Option) *Engine {
	e := &Engine{store: store, log: slog.Default(), obs: NopObserver{},
		timeout: DefaultTimeout, brk: newBreaker(), name: "drip"}
	_, e.inproc = store.(drip.InProcess)
	for _, o := range opts {
		o(e)
	}
	// drip.Separately: on a store that cannot take a request's keys in one
	// step (Redis Cluster across hash slots), every multi-key call is
	// applied one key at a time instead; with WithSeparateTakes, without
	// asking the store first.
	e.store = drip.Separately{Store: store, Always: e.separate}
	if e.timeout <= 0 {
		e.timeout = DefaultTimeout
	}
	return e
}

// Store returns the engine's store.
func (e *Engine) Store() drip.Store { return e.store }

// BreakerState returns the circuit breaker's state.
func (e *Engine) BreakerState() string { return e.brk.State() }

// Observer returns the engine's observer.
func (e *Engine) Observer() Observer { return e.obs }

// Close releases the local fallback's memory store, if one was started.
func (e *Engine) Close() error {
	e.localMu.Lock()
	defer e.localMu.Unlock()
	e.closed = true
	if e.local != nil {
		return e.local.Close()
	}
	return nil
}

// Rules is a rules Set ready for Decide: build it with Engine.Compile
// whenever the rules change, and hold it as an immutable snapshot.
type Rules struct {
	Set     *rules.Set
	timeout time.Duration
	breaker rules.Breaker
	policy  []string // per rule: `"name";q=20;w=2`
}

// Compile prepares set (nil: rules.Default()) for Decide.
func (e *Engine) Compile(set *rules.Set) *Rules {
	if set == nil {
		set = rules.Default()
	}
	rs := &Rules{Set: set, timeout: e.timeout, breaker: set.Breaker}
	if set.StoreTimeout > 0 {
		rs.timeout = set.StoreTimeout
	}
	if rs.breaker.Failures <= 0 {
		rs.breaker.Failures = rules.DefaultBreakerFailures
	}
	if rs.breaker.Cooldown <= 0 {
		rs.breaker.Cooldown = rules.DefaultBreakerCooldown
	}
	rs.policy = make([]string, len(set.Rules))
	for i := range set.Rules {
		rs.policy[i] = PolicyItem(set.Rules[i].Name, set.Rules[i].Limit)
	}
	return rs
}

// Timeout is the deadline of each store call under rs.
func (rs *Rules) Timeout() time.Duration { return rs.timeout }

// defaultBreaker is the breaker of store calls made without rules.
var defaultBreaker = rules.Breaker{Failures: rules.DefaultBreakerFailures, Cooldown: rules.DefaultBreakerCooldown}

// Apply makes one store call (Store.Apply for one request, ApplyMulti for
// several) behind the circuit breaker and under the engine's deadline (or
// the shorter one of ctx), and reports its latency and any failure to the
// observer. A call the breaker skips fails with ErrBreakerOpen. Input
// errors (drip.IsInput) are the caller's, not the store's: they neither
// count against the breaker nor reach the observer.
func (e *Engine) Apply(ctx context.Context, op drip.Op, reqs []drip.Request) (drip.Multi, error) {
	return e.apply(ctx, e.timeout, defaultBreaker, op, reqs)
}

func (e *Engine) apply(ctx context.Context, timeout time.Duration, br rules.Breaker, op drip.Op, reqs []drip.Request) (m drip.Multi, err error) {
	if e.tracer != nil { // trace.go
		var sp trace.Span
		ctx, sp = e.startStore(ctx, op, len(reqs))
		defer func() { endStore(sp, err) }()
	}
	now := e.clock()
	ok, tk, changed := e.brk.allow(now)
	e.breakerChanged(changed)
	if !ok {
		return drip.Multi{}, ErrBreakerOpen
	}
	cctx := ctx
	if !e.inproc {
		var cancel context.CancelFunc
		cctx, cancel = context.WithTimeout(ctx, timeout)
		defer cancel()
	}
	start := time.Now()
	if len(reqs) == 1 {
		var d drip.Decision
		d, err = e.store.Apply(cctx, op, e.at(), reqs[0])
		if err == nil {
			m = drip.Combine([]drip.Decision{d})
		}
	} else {
		m, err = e.store.ApplyMulti(cctx, op, e.at(), reqs)
	}
	e.obs.StoreLatency(time.Since(start))
	if err == nil && len(m.Decisions) != len(reqs) {
		err = errors.New("the store returned a wrong number of decisions")
	}
	if err != nil {
		if drip.IsInput(err) {
			e.brk.abandon(tk)
			return drip.Multi{}, err
		}
		e.obs.StoreError(err)
		e.logError("store call failed", err)
		if ctx.Err() == nil {
			e.breakerChanged(e.brk.failure(e.clock(), br.Failures, br.Cooldown, tk))
		} else {
			// The caller gave up: not the store's fault, so nothing is
			// counted; a probe frees its place for the next call.
			e.brk.abandon(tk)
		}
		return drip.Multi{}, err
	}
	e.breakerChanged(e.brk.success(tk))
	return m, nil
}

// localMaxKeys bounds the local fallback's memory.
const localMaxKeys = 1 << 16

func (e *Engine) localStore() *memstore.Store {
	e.localMu.Lock()
	defer e.localMu.Unlock()
	if e.local == nil {
		if e.closed { // no sweeper goroutine may outlive Close
			e.local = memstore.New(memstore.WithMaxKeys(localMaxKeys), memstore.WithSweep(0))
		} else {
			e.local = memstore.New(memstore.WithMaxKeys(localMaxKeys))
		}
	}
	return e.local
}

func (e *Engine) at() time.Time {
	if e.now == nil {
		return time.Time{}
	}
	return e.now()
}

func (e *Engine) clock() time.Time {
	if e.now == nil {
		return time.Now()
	}
	return e.now()
}

func (e *Engine) breakerChanged(state string) {
	if state == "" {
		return
	}
	e.obs.BreakerState(state)
	e.log.Warn(e.name+": store circuit breaker "+state, "state", state)
}

// LogError logs err as a warning with the engine's logger and name, at
// most one error a second (with those of the store), so that an outage or
// a flood of bad requests does not flood the log.
func (e *Engine) LogError(msg string, err error) { e.logError(msg, err) }

// logError logs at most one error a second, so that an outage does not
// flood the log (the observer counts every one).
func (e *Engine) logError(msg string, err error) {
	now := time.Now().UnixNano()
	last := e.lastLog.Load()
	if now-last < int64(time.Second) || !e.lastLog.CompareAndSwap(last, now) {
		return
	}
	e.log.Warn(e.name+": "+msg, "err", err)
}
