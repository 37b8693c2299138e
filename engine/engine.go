// Package engine is drip's one decision engine. Every front door hands
// it what a request offers and renders what it answers: the net/http
// middleware, the gRPC interceptors, the gateway, the decision API and
// Envoy's rate limit service.
//
// Decide takes a request's values for the rules' limit keys (Values). It
// matches the rules (groups, shadow) and makes one all-or-nothing store
// call, under a deadline and behind a circuit breaker. When the store
// fails, each rule's on_error applies: allow, deny, or a local limiter
// (WithLocal). A denial the store's last answer proved is repeated
// without a store call (WithDenials). Adaptive rules learn their limit
// from the responses (Outcome.Drop, Outcome.Release).
//
// Decide returns one Outcome, as data: the decision, the rules that
// decided, the RateLimit field values, Retry-After with jitter and the
// reason. The Observer hears events in one vocabulary (Event). Each door
// renders the Outcome its own way; the engine knows no transport.
//
// Doors that match limits their own way (Envoy's descriptors) call
// DecideItems with one Applied per limit (NewApplied). It is Decide's
// orchestration, with refunds and quota modes besides, and it returns
// the same Outcome. Apply is one observed store call, as the decision API
// makes.
//
// The engine is public so that programs can build front doors of their
// own that behave as drip's do. An Engine is safe for concurrent use.
package engine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/driplimit/drip"
	"github.com/driplimit/drip/bucket"
	"github.com/driplimit/drip/override"
	"github.com/driplimit/drip/rules"
	"github.com/driplimit/drip/store"
)

// DefaultTimeout is the longest a decision waits on the store, unless
// WithTimeout or the rules file's store_timeout says otherwise. A
// caller's own deadline shortens it. It is generous on purpose: a store
// slow for a moment makes decisions slower, not wrong. The circuit
// breaker finds a store that is down: in its stall time (750 ms unless
// set), or at once when it refuses connections. An in-process store
// (Caps.InProcess) gets no deadline of its own.
const DefaultTimeout = time.Second

// MaxPending bounds the store calls an engine waits on at once. A call
// beyond it fails at once with ErrOverloaded, and the rule's on_error
// decides. A store that cannot keep up then costs no deadline per caller
// and piles up no goroutines.
const MaxPending = 4096

// ErrBreakerOpen is the error of a store call that the circuit breaker
// did not make.
var ErrBreakerOpen = errors.New("circuit breaker open: the store failed or stopped answering, and is not called until a probe gets through (circuit_breaker in the rules file)")

// ErrStalled is the error of a store call that failed after the store
// answered nothing at all for the breaker's stall time: the breaker opens.
var ErrStalled = errors.New("the store answered nothing within the circuit breaker's stall time (circuit_breaker.stall), so the breaker opened")

// ErrOverloaded is the error of a store call shed because MaxPending
// calls were already waiting on the store.
var ErrOverloaded = errors.New("too many decisions waiting on the store: shed without calling it")

// Engine decides requests with state in a store.Store. Construct it with
// New; it is safe for concurrent use.
type Engine struct {
	store    store.Store
	log      *slog.Logger
	obs      Observer
	keys     KeyObserver // WithKeys; nil: none
	timeout  time.Duration
	now      func() time.Time // nil: the store's clock
	brk      *breaker
	lastLog  atomic.Int64
	pending  atomic.Int64 // store calls waiting (not for an InProcess store)
	answered atomic.Int64 // when the store last answered a call (a success or an error it sent), UnixNano on the real clock
	latency  atomic.Int64 // the store's usual answer time: an average of recent calls, ns
	separate bool         // WithSeparateTakes
	inproc   bool         // the store's Caps say InProcess: its calls get no deadline
	shared   *Engine      // Shared: New returns it
	name     string
	ovr      atomic.Pointer[override.Snapshot] // overrides.go
	tracer   trace.Tracer                      // WithTracerProvider; nil: no tracing
	kind     attribute.KeyValue                // drip.store, on every span

	denials   store.DenialsOptions // WithDenials (denials.go)
	noDenials bool                 // WithoutDenials
	deny      *store.Denials       // the store's local denials, asked before any deadline is set; nil: none

	queues queues    // the requests waiting for their turn (queue.go)
	adapt  adaptives // the adaptive rules' learned limits (adaptive.go)

	localMu  sync.Mutex
	newLocal func() store.Store // WithLocal; nil: on_error local allows
	local    store.Store
	closed   bool
}

// New returns an Engine with state in store.
func New(st store.Store, opts ...Option) *Engine {
	e := &Engine{store: st, log: slog.Default(), obs: NopObserver{},
		timeout: DefaultTimeout, brk: newBreaker(), name: "drip"}
	for _, o := range opts {
		o(e)
	}
	if e.shared != nil {
		return e.shared
	}
	e.inproc = st.Caps().InProcess
	// store.Separately: on a store that cannot take a request's keys in one
	// step (Redis Cluster across hash slots), every multi-key call is
	// applied one key at a time instead; with WithSeparateTakes, without
	// asking the store first.
	if d, ok := st.(*store.Denials); ok {
		e.store, e.deny = store.Separately{Store: d, Always: e.separate}, d
	} else {
		e.store = e.withDenials(store.Separately{Store: st, Always: e.separate})
	}
	if e.timeout <= 0 {
		e.timeout = DefaultTimeout
	}
	return e
}

// Store returns the engine's store.
func (e *Engine) Store() store.Store { return e.store }

// BreakerState returns the circuit breaker's state.
func (e *Engine) BreakerState() string { return e.brk.State() }

// Observer returns the engine's observer.
func (e *Engine) Observer() Observer { return e.obs }

// Keys returns the engine's key observer (WithKeys), or nil.
func (e *Engine) Keys() KeyObserver { return e.keys }

// defaultBreaker is the breaker of store calls made without rules.
var defaultBreaker = rules.DefaultBreaker

// Apply makes one store call for reqs, behind the circuit breaker and
// under the engine's deadline or ctx's, if shorter. It checks and
// decides the requests as drip.Apply does. Each is prepared by plans[i],
// its limit compiled (PlanOf: a rule's plan). A nil plan, or nil plans,
// is compiled now for this call. The observer hears the call's latency
// and any failure. A call the breaker skips fails with ErrBreakerOpen.
// Input errors (store.IsInput) are the caller's: the breaker and the
// observer never see them. An error the store answered about the items
// (store.IsAnswered) reaches the observer. The breaker counts it as an
// answer.
func (e *Engine) Apply(ctx context.Context, op bucket.Op, reqs []drip.Request, plans []*Plan) (drip.Multi, error) {
	sc := scratches.Get().(*scratch) // step's memory: the same sizes
	defer sc.free()
	ds, err := e.applyGuarded(ctx, e.timeout, defaultBreaker, op, reqs, sc.planned(reqs, plans), sc)
	if err != nil {
		return drip.Multi{}, err
	}
	return multiOf(ds), nil
}

// freed tells the queues of the leases among reqs, refunded: a slot is
// free, the first waiting for it asks.
func (e *Engine) freed(reqs []drip.Request) {
	for _, r := range reqs {
		if r.Lease != "" {
			e.queues.released(r.Key)
		}
	}
}

// applyPlans is apply for requests the engine holds the plans of
// (plans[i] is reqs[i].Limit's but for its MaxReserved, a charge's debt
// bound): each prepared by its plan (Plan.prepare), a keyed or calendar
// window placed there, not through drip.Apply and its cache of params.
// Its checks, their order, its errors and its decisions are
// drip.Apply's.
func (e *Engine) applyPlans(ctx context.Context, timeout time.Duration, br rules.Breaker, op bucket.Op, reqs []drip.Request, plans []*Plan) ([]drip.Decision, error) {
	sc := scratches.Get().(*scratch) // step's memory: the same sizes
	defer sc.free()
	return e.applyGuarded(ctx, timeout, br, op, reqs, plans, sc)
}

// applyGuarded is applyIn behind the breaker br, under timeout (Apply
// and applyPlans): an input error the store never saw is a refusal, and
// a refund frees its leases' waiters.
func (e *Engine) applyGuarded(ctx context.Context, timeout time.Duration, br rules.Breaker, op bucket.Op, reqs []drip.Request, plans []*Plan, sc *scratch) ([]drip.Decision, error) {
	g := &guarded{e: e, timeout: timeout, br: br}
	ds, err := applyIn(ctx, g, op, e.at(), reqs, plans, sc)
	if err != nil && !g.asked {
		e.refused(ctx, op, len(reqs), err)
	}
	if err == nil && op == bucket.Refund {
		e.freed(reqs)
	}
	return ds, err
}

// applyPlansOn is drip.Apply of reqs on st at at, each request prepared
// by its plan (preparePlans).
func applyPlansOn(ctx context.Context, st store.Store, op bucket.Op, at time.Time, reqs []drip.Request, plans []*Plan) ([]drip.Decision, error) {
	sc := scratches.Get().(*scratch) // step's memory: the same sizes
	defer sc.free()
	return applyIn(ctx, st, op, at, reqs, plans, sc)
}

// applyIn is applyPlansOn in sc's memory.
func applyIn(ctx context.Context, st store.Store, op bucket.Op, at time.Time, reqs []drip.Request, plans []*Plan, sc *scratch) ([]drip.Decision, error) {
	items, res := sc.sized(len(reqs))
	if err := preparePlans(op, at, reqs, plans, items, len(reqs) > 1); err != nil {
		return nil, err
	}
	if err := st.Apply(ctx, op, at, items, res); err != nil {
		return nil, err
	}
	return decisionsOf(at, plans, items, res), nil
}

// decisionsOf is the decisions of res, the results of items (under
// plans) decided at at: drip.Apply's.
func decisionsOf(at time.Time, plans []*Plan, items []bucket.Prepared, res []bucket.Result) []drip.Decision {
	ds := make([]drip.Decision, len(res))
	for i := range res {
		plans[i].hints(&res[i], &items[i].Params, at)
		ds[i] = drip.DecisionOf(res[i], items[i].Params.Burst)
	}
	return ds
}

// multiOf is the decisions ds of one call as drip.Apply answers them:
// allowed when all are, retry after the longest wait of the denials
// (of all when allowed).
func multiOf(ds []drip.Decision) drip.Multi {
	m := drip.Multi{Allowed: allAllowed(ds), Decisions: ds}
	for _, d := range ds {
		if !m.Allowed && d.Allowed {
			continue
		}
		m.RetryAfter = max(m.RetryAfter, d.RetryAfter)
	}
	return m
}

// allAllowed reports whether every one of ds was allowed: a call of
// several requests all applied (drip.Multi.Allowed).
func allAllowed(ds []drip.Decision) bool {
	for _, d := range ds {
		if !d.Allowed {
			return false
		}
	}
	return true
}

// preparePlans prepares reqs into items under plans at at, as
// drip.Apply checks them (the key, the limit, the cost, the lease; an
// error names its request when multi), each with its request's debt
// bound (Limit.MaxReserved; none: the most drip takes).
func preparePlans(op bucket.Op, at time.Time, reqs []drip.Request, plans []*Plan, items []bucket.Prepared, multi bool) error {
	for i := range reqs {
		r, pl := &reqs[i], plans[i]
		q := pl.params
		q.MaxReserved = debtOf(&r.Limit, pl)
		var c int64
		err := pl.err // the limit's problem comes before the cost's
		if err == nil {
			c, err = store.Cost(op, r.Cost, r.Reserve, q)
		}
		if err := pl.prepare(&items[i], op, r.Key, at, c, err, r.Reserve, r.Lease); err != nil {
			if multi {
				return fmt.Errorf("requests[%d]: %w", i, err)
			}
			return err
		}
		items[i].Params.MaxReserved = q.MaxReserved
	}
	return store.CheckDistinct(items)
}

// debtOf is the most debt, in fixed point, a request of limit l may run
// up under plan pl, as drip.Limit.Params holds it: l.MaxReserved, or
// none (the most drip takes) when zero; zero where the plan's algorithm
// reserves nothing (its own bound is zero: sliding windows, slots).
func debtOf(l *drip.Limit, pl *Plan) int64 {
	switch {
	case pl.params.MaxReserved == 0:
		return 0
	case l.MaxReserved > 0:
		return int64(math.Round(l.MaxReserved * bucket.Micro))
	}
	return int64(math.Round(store.MaxAmount * bucket.Micro))
}

// guarded is the engine's store seen through call: what drip.Apply hands
// its checked items to.
type guarded struct {
	e       *Engine
	timeout time.Duration
	br      rules.Breaker
	asked   bool // the items passed drip.Apply's checks
}

func (g *guarded) Apply(ctx context.Context, op bucket.Op, at time.Time, items []bucket.Prepared, res []bucket.Result) error {
	g.asked = true
	return g.e.call(ctx, g.timeout, g.br, op, at, items, res)
}

func (g *guarded) Reset(ctx context.Context, key string) error { return g.e.store.Reset(ctx, key) }

func (g *guarded) Caps() store.Caps { return g.e.store.Caps() }

// call executes prepared items in one store call (store.Store.Apply, at
// the time at), behind the breaker (br: its settings) and under the
// deadline timeout (or ctx's, if shorter), and reports its latency and
// any failure to the observer and the tracer: the one road of the
// engine's store calls.
func (e *Engine) call(ctx context.Context, timeout time.Duration, br rules.Breaker, op bucket.Op, at time.Time, items []bucket.Prepared, res []bucket.Result) (err error) {
	if e.deny != nil && e.deny.Answer(op, at, items, res) {
		// Proven denied by the store's last answer: no store call, so
		// neither the breaker, a deadline nor a store span has a part in
		// it.
		return nil
	}
	if e.tracer != nil { // trace.go
		var sp trace.Span
		ctx, sp = e.startStore(ctx, op, len(items))
		defer func() { endStore(sp, err) }()
	}
	ok, tk, changed := e.brk.allow(e.clock())
	e.breakerChanged(changed)
	if !ok {
		return ErrBreakerOpen
	}
	if tk.probe {
		// A store call that panics must not leave the breaker waiting
		// for its probe forever: the next call becomes the probe.
		defer func() {
			if r := recover(); r != nil {
				e.brk.abandon(tk)
				panic(r)
			}
		}()
	}
	cctx := ctx
	start := time.Now()
	var w *watch
	if !e.inproc {
		if e.pending.Add(1) > MaxPending {
			e.pending.Add(-1)
			e.brk.abandon(tk)
			e.obs.StoreError(ErrOverloaded)
			e.logError("store call shed", ErrOverloaded)
			return ErrOverloaded
		}
		defer e.pending.Add(-1)
		stall := e.stallAfter(br, timeout)
		if tk.probe {
			// A probe asks whether the store is back: it need not wait
			// longer than the stall time that judges it. Its deadline
			// is the one the server holds it to, so its caller waits
			// no longer than that either.
			timeout = min(timeout, stall)
		}
		if dl, ok := ctx.Deadline(); !ok || dl.After(start.Add(timeout)) {
			// (A caller's deadline within the timeout, such as Envoy's
			// 20 ms, bounds the call already: no context, no timer.)
			var cancel context.CancelFunc
			cctx, cancel = context.WithTimeout(ctx, timeout)
			defer cancel()
		}
		w = &watch{e: e, br: br, tk: tk, start: start.UnixNano(), stall: stall}
		w.timer = time.AfterFunc(time.Hour, w.fire) // set before it can fire: fire may Reset it
		w.set(w.start, w.stall)
		defer w.end()
	}
	err = e.store.Apply(cctx, op, at, items, res)
	took := time.Since(start)
	e.obs.StoreLatency(took)
	if err == nil {
		if w != nil {
			e.answered.Store(time.Now().UnixNano())
			e.learnLatency(took)
		}
		e.breakerChanged(e.brk.success(e.clock(), tk))
		return nil
	}
	if store.IsInput(err) {
		e.brk.abandon(tk)
		return err
	}
	if store.IsAnswered(err) {
		// The store answered, with an error about this call's items: it
		// is up, and the error is this call's alone. Counted as a call
		// that reached the store, never as a failure, so that no request
		// shape can open the breaker for every key.
		if w != nil {
			e.answered.Store(time.Now().UnixNano())
		}
		e.breakerChanged(e.brk.success(e.clock(), tk))
		e.obs.StoreError(err)
		e.logError("store call refused", err)
		return err
	}
	late := errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled)
	switch {
	case ctx.Err() != nil:
		// The caller gave up: not the store's fault, so nothing is
		// counted; a probe frees its place for the next call. If the
		// store answered nothing meanwhile, the stall timer watches on:
		// callers whose deadlines are all shorter than the stall time (a
		// gRPC deadline, Envoy's timeout) must not hide a stalled store.
		if w != nil && e.answered.Load() < w.start {
			w.left.Store(true)
		}
		e.brk.abandon(tk)
	case w != nil && w.stalled.Load():
		// The stall timer opened the breaker.
		err = fmt.Errorf("%w: nothing for %v, and this call gave up at its deadline after %v: %w", ErrStalled, w.stall, took.Round(time.Millisecond), err)
	case late && w != nil && (e.answered.Load() >= w.start || took > timeout+starved):
		// Slow, not down: the store answered other calls meanwhile, or
		// this process was starved of CPU (its deadline fired late), so
		// its silence says little about the store.
		err = fmt.Errorf("the store did not answer within the deadline of %v, though it is answering (raise store_timeout, drip serve --store-timeout): %w", timeout, err)
		e.breakerChanged(e.brk.success(e.clock(), tk))
	default:
		if late {
			err = fmt.Errorf("the store answered nothing within the deadline of %v: %w", timeout, err)
		} else if w != nil {
			e.answered.Store(time.Now().UnixNano()) // it did answer, with an error
		}
		e.breakerChanged(e.brk.failure(e.clock(), br, tk))
	}
	e.obs.StoreError(err)
	e.logError("store call failed", err)
	return err
}

// watch is a store call's stall timer: when the store has answered
// nothing for the stall time (since its last answer, or since the call
// began if that is later) while the call waits, the breaker opens, so
// that the calls after it go to on_error at once. Each time the timer
// fires too early (the store answered meanwhile) it is set again for the
// rest.
//
// A timer that runs late (by more than an eighth of the stall time) is
// set again for as long as it was late: the process itself was not
// running, and what looks like a silent store may be answers it has not
// read yet.
//
// When the caller gives up before the store answered anything, the timer
// runs on to the stall time: if the store has still answered nothing then,
// and other calls wait on it, it is stalled just the same.
//
// The waiting call itself is not given up: it keeps its deadline, which
// the store server holds it to. Cancelling it sooner could leave a take
// that the server applied (its deadline had not passed) answered to the
// caller as an error, where a call that ends at its deadline is refused
// by the server, or taken back (batch.Undo).
type watch struct {
	e       *Engine
	br      rules.Breaker
	tk      ticket
	start   int64 // UnixNano
	stall   time.Duration
	timer   *time.Timer
	due     atomic.Int64 // when the timer is set to fire, UnixNano
	done    atomic.Bool  // the call ended: the timer does nothing more
	left    atomic.Bool  // the caller gave up with no answer from the store: the timer runs on
	stalled atomic.Bool
}

// set arms the timer to fire d after now (UnixNano).
func (w *watch) set(now int64, d time.Duration) {
	w.due.Store(now + int64(d))
	w.timer.Reset(d)
}

func (w *watch) fire() {
	if w.done.Load() {
		return
	}
	now := time.Now().UnixNano()
	if late := time.Duration(now - w.due.Load()); late > w.stall/8 {
		// The timer ran late: this process did not run for a while (a
		// busy host, a GC pause), and answers that came meanwhile may
		// not have been read yet (the runtime runs timers before it
		// polls the network). Look again once it has had as long again
		// to read them, at most the stall time. (A store that stays
		// silent on a host that stays this busy is still found: by the
		// calls that end at their deadline with no answer.)
		w.set(now, min(late, w.stall))
		return
	}
	answered := w.e.answered.Load()
	if w.left.Load() && (answered >= w.start || w.e.pending.Load() == 0) {
		return // the store answered since, or no call waits on it: nothing to tell
	}
	quiet := time.Duration(now - max(answered, w.start))
	if quiet < w.stall {
		w.set(now, max(w.stall-quiet, time.Millisecond)) // the store answered meanwhile
		return
	}
	w.stalled.Store(true)
	w.e.breakerChanged(w.e.brk.stalled(w.e.clock(), w.br, w.tk))
}

// starved is how late a deadline error may come back before the engine
// takes it that its process was starved of CPU rather than its store
// silent.
const starved = 25 * time.Millisecond

// end stops the timer: the call is over (unless its caller left before
// the store answered: see watch).
func (w *watch) end() {
	if w.left.Load() {
		return
	}
	w.done.Store(true)
	w.timer.Stop()
}

// stallAfter is how long a call waits with the store answering nothing
// before the store counts as stalled: the breaker's stall time (unset:
// rules.DefaultBreakerStall, or half the store deadline if that is
// longer, so that a program or test that gives its store a generous
// deadline gets a patient breaker too), or eight times the store's usual
// answer time if that is longer (a store far away or under load is not
// stalled at its usual pace).
func (e *Engine) stallAfter(br rules.Breaker, timeout time.Duration) time.Duration {
	stall := br.Stall
	if stall <= 0 {
		stall = max(rules.DefaultBreakerStall, timeout/2)
	}
	return max(stall, 8*time.Duration(e.latency.Load()))
}

// learnLatency folds a call that took d into the store's usual answer
// time (an exponentially weighted average, 1/8 for the newest; updates
// that race may drop one, which an average can afford).
func (e *Engine) learnLatency(d time.Duration) {
	old := e.latency.Load()
	if old == 0 {
		e.latency.Store(int64(d))
		return
	}
	e.latency.Store(old + (int64(d)-old)/8)
}

func (e *Engine) at() time.Time {
	if e.now == nil {
		return time.Time{}
	}
	return e.now()
}

// Now returns the engine's clock: WithClock's, else the real clock.
// Front doors read it for token expiry.
func (e *Engine) Now() time.Time { return e.clock() }

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

// LogError logs err as a warning with the engine's logger and name. It
// logs at most one error a second, the store's included, so an outage
// does not flood the log.
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
