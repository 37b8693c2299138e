// Package httplimit is drip's net/http middleware: it applies a rules file
// (package rules) to each request, with bucket state in any drip.Store.
//
// For each request, in file order, every rule whose match holds applies,
// except that within a group only the first matching rule does (tiers). A
// rule whose limit key has no value in the request (no such header, no
// verified claim) does not apply, and the next rule of its group may. The
// enforce rules that apply are taken all or nothing in one store call
// (ApplyMulti): if any denies, none is consumed, and the answer is 429
// with RateLimit headers, a Retry-After jittered per client, and an
// application/problem+json body naming the rule and the reason.
//
// Shadow rules are decided and counted but never block. They are taken in
// a second store call, after the enforce rules allowed the request (so they
// never consume the enforce rules' tokens, and a request that is denied
// anyway does not drain them); when the request was denied they are only
// peeked, so they are still decided and counted.
//
// When the store fails or exceeds its deadline, each rule's on_error
// decides: allow (log and count), deny (503), or local (a per-instance
// memory limiter at a share of the rule's rate and burst). A circuit
// breaker stops calling a store that keeps failing, so that a dead store
// costs no deadline per request; after its cooldown one probe goes
// through, and only the probe's success closes it.
package httplimit

import (
	"context"
	"errors"
	"log/slog"
	"math"
	"net/http"
	"net/netip"
	"net/url"
	"path"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/driplimit/drip"
	"github.com/driplimit/drip/rules"
	"github.com/driplimit/drip/store/memstore"
)

// DefaultTimeout is the default deadline of each store call.
const DefaultTimeout = 50 * time.Millisecond

// Outcome is what happened to one rule for one request.
type Outcome string

const (
	// Allowed: the rule's bucket allowed the request and was taken from.
	Allowed Outcome = "allowed"
	// Denied: the rule's bucket denied the request.
	Denied Outcome = "denied"
	// NotTaken: the rule's bucket would have allowed the request, but
	// another rule denied it, so nothing was taken (all or nothing).
	NotTaken Outcome = "not_taken"
	// ErrorAllowed: the store failed and the rule's on_error let the
	// request through (allow; and every shadow rule).
	ErrorAllowed Outcome = "error_allowed"
	// ErrorDenied: the store failed and the rule's on_error is deny (503).
	ErrorDenied Outcome = "error_denied"
	// LocalAllowed and LocalDenied: the store failed and the local
	// fallback decided.
	LocalAllowed Outcome = "local_allowed"
	LocalDenied  Outcome = "local_denied"
)

// Reasons of a denial, in the problem+json body.
const (
	ReasonTokenBucket      = "token_bucket_exceeded"
	ReasonFixedWindow      = "fixed_window_exceeded"
	ReasonCostExceedsBurst = "cost_exceeds_burst"
	ReasonStoreUnavailable = "store_unavailable"
)

// ErrBreakerOpen is the error of a store call that the circuit breaker
// did not make.
var ErrBreakerOpen = errors.New("httplimit: circuit breaker open: store not called")

// Observer receives what a Limiter does, for metrics. Its methods are
// called on the request path and must be fast and safe for concurrent
// use. Embed NopObserver to implement only some of them.
type Observer interface {
	// Decision is called once per request for each rule that applied.
	Decision(rule string, mode rules.Mode, outcome Outcome)
	// StoreError is called for each failed store call (not for calls the
	// breaker skipped).
	StoreError(err error)
	// StoreLatency is called for each store call made.
	StoreLatency(d time.Duration)
	// BreakerState is called when the circuit breaker changes state
	// (BreakerClosed, BreakerOpen, BreakerHalfOpen).
	BreakerState(state string)
}

// NopObserver does nothing; embed it to implement part of Observer.
type NopObserver struct{}

func (NopObserver) Decision(string, rules.Mode, Outcome) {}
func (NopObserver) StoreError(error)                     {}
func (NopObserver) StoreLatency(time.Duration)           {}
func (NopObserver) BreakerState(string)                  {}

// Limiter applies a rules Set to HTTP requests. It is safe for concurrent
// use; Swap replaces its rules atomically. Construct it with New.
type Limiter struct {
	store    drip.Store
	snap     atomic.Pointer[snapshot]
	log      *slog.Logger
	obs      Observer
	timeout  time.Duration
	now      func() time.Time // nil: the store's clock
	brk      *breaker
	lastLog  atomic.Int64
	separate bool // WithSeparateTakes

	localMu sync.Mutex
	local   *memstore.Store
	closed  bool
}

// Option configures a Limiter.
type Option func(*Limiter)

// WithLogger sets the logger for store failures and breaker changes
// (default slog.Default()).
func WithLogger(log *slog.Logger) Option { return func(l *Limiter) { l.log = log } }

// WithObserver sets the observer of decisions, store calls and the
// breaker.
func WithObserver(o Observer) Option { return func(l *Limiter) { l.obs = o } }

// WithTimeout sets the deadline of each store call (default
// DefaultTimeout). A rules file's store_timeout takes precedence.
func WithTimeout(d time.Duration) Option { return func(l *Limiter) { l.timeout = d } }

// WithSeparateTakes is for stores that cannot take several keys in one
// atomic step, such as Redis Cluster (whose multi-takes need every key in
// one hash slot, while rules' keys land anywhere): the enforce rules of a
// request are taken one store call each, in file order, and when one
// denies, those already taken are refunded. Without the option, a store
// that answers a multi-take with drip.ErrNotColocated gets the same
// treatment through drip.Separately, after a first attempt that the store
// refuses without a round trip. All or nothing then holds in
// the end rather than at every instant: between a take and its refund,
// another request may find fewer tokens.
func WithSeparateTakes() Option { return func(l *Limiter) { l.separate = true } }

// WithClock makes the limiter pass now() as the time of each decision
// (instead of the store's clock), and use it for token expiry and the
// circuit breaker.
func WithClock(now func() time.Time) Option { return func(l *Limiter) { l.now = now } }

// New returns a Limiter that applies set with state in store. A nil set
// means rules.Default().
func New(store drip.Store, set *rules.Set, opts ...Option) *Limiter {
	// drip.Separately: on a store that cannot take a request's keys in one
	// step (Redis Cluster across hash slots), every multi-key call (enforce
	// takes, shadow takes, peeks) is applied one key at a time instead.
	l := &Limiter{store: drip.Separately{Store: store}, log: slog.Default(), obs: NopObserver{}, timeout: DefaultTimeout, brk: newBreaker()}
	for _, o := range opts {
		o(l)
	}
	if set == nil {
		set = rules.Default()
	}
	l.Swap(set)
	return l
}

// Swap makes set the rules of every request from now on. Requests in
// flight finish with the rules they started with. Bucket keys depend only
// on rule names and key values, so a rule that keeps its name keeps its
// buckets.
func (l *Limiter) Swap(set *rules.Set) {
	s := &snapshot{set: set, jwt: newVerifier(set.JWT, l.now), timeout: l.timeout}
	if set.StoreTimeout > 0 {
		s.timeout = set.StoreTimeout
	}
	if s.timeout <= 0 {
		s.timeout = DefaultTimeout
	}
	s.breaker = set.Breaker
	if s.breaker.Failures <= 0 {
		s.breaker.Failures = rules.DefaultBreakerFailures
	}
	if s.breaker.Cooldown <= 0 {
		s.breaker.Cooldown = rules.DefaultBreakerCooldown
	}
	s.policy = make([]string, len(set.Rules))
	for i := range set.Rules {
		s.policy[i] = policyItem(set.Rules[i].Name, set.Rules[i].Limit)
	}
	l.snap.Store(s)
}

// Rules returns the rules in force.
func (l *Limiter) Rules() *rules.Set { return l.snap.Load().set }

// Store returns the limiter's store.
func (l *Limiter) Store() drip.Store { return l.store }

// BreakerState returns the circuit breaker's state.
func (l *Limiter) BreakerState() string { return l.brk.State() }

// Close releases the local fallback's memory store, if one was started.
func (l *Limiter) Close() error {
	l.localMu.Lock()
	defer l.localMu.Unlock()
	l.closed = true
	if l.local != nil {
		return l.local.Close()
	}
	return nil
}

// snapshot is one rules Set ready for requests.
type snapshot struct {
	set     *rules.Set
	jwt     *verifier
	timeout time.Duration
	breaker rules.Breaker
	policy  []string // per rule: `"name";q=20;w=2`
}

// Handler returns next behind the limiter: a request over an enforce
// rule's limit gets 429 (or 503 when the store fails and on_error is deny)
// and never reaches next; every request that enforce rules decided gets
// the RateLimit headers.
func (l *Limiter) Handler(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		res := l.Decide(r.Context(), r)
		res.WriteHeaders(w.Header())
		if !res.Allowed {
			res.WriteError(w)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// Result is the decision on one request.
type Result struct {
	// Allowed reports whether the request may proceed.
	Allowed bool
	// Status is 0 when allowed, else 429 (over a limit) or 503 (the store
	// failed and on_error is deny).
	Status int
	// Reason of a denial: ReasonTokenBucket, ReasonFixedWindow,
	// ReasonCostExceedsBurst or ReasonStoreUnavailable.
	Reason string
	// Top is the rule that denied the request, or else the most
	// restrictive enforce rule (least remaining): the one the single-value
	// headers describe. Nil when no enforce rule was decided.
	Top *Applied
	// RetryAfter is the Retry-After header's value in seconds on a 429:
	// the wait rounded up plus a jitter fixed by Identity (the rules'
	// retry_after_jitter: by default up to 50% of the wait, at most 60 s).
	// Zero when the request can never succeed (cost_exceeds_burst).
	RetryAfter int64
	// Identity is the client identity that seeds the jitter, set on a
	// denial: "sub:" and the verified JWT subject, else "ip:" and the
	// client IP (its /64 for IPv6), else "key:" and the denying rule's key.
	Identity string
	// Applied lists the rules that applied, enforce rules first, each in
	// file order.
	Applied []Applied
	// Err is the store error when the store failed (the fail policy then
	// decided), or nil.
	Err error
}

// Applied is one rule applied to a request.
type Applied struct {
	Rule *rules.Rule
	// Key is the bucket key.
	Key string
	// Cost is the request's cost under the rule.
	Cost float64
	// Decision is the bucket's decision; meaningful when Decided.
	Decision drip.Decision
	// Decided reports whether a bucket decided (the store or the local
	// fallback).
	Decided bool
	// Local reports that the local fallback decided, at Limit.
	Local bool
	// Limit is the limit the decision was made under: the rule's, or the
	// local fallback's share of it.
	Limit drip.Limit
	// Outcome is what happened to the rule.
	Outcome Outcome
	// Reason is why the rule denied, if it did.
	Reason string

	policy string
}

// Decide decides r without writing a response: the middleware's work,
// for callers that answer requests themselves. It takes the tokens of an
// allowed request.
func (l *Limiter) Decide(ctx context.Context, r *http.Request) *Result {
	s := l.snap.Load()
	rv := &reqValues{r: r, s: s}
	var enf, sh []Applied
	var groups []string
	for i := range s.set.Rules {
		rule := &s.set.Rules[i]
		if rule.Group != "" && slices.Contains(groups, rule.Group) {
			continue
		}
		if !rule.Matches(rv.get) {
			continue
		}
		vals, ok := rule.Values(rv.get)
		if !ok {
			continue
		}
		if rule.Group != "" {
			groups = append(groups, rule.Group)
		}
		a := Applied{Rule: rule, Key: rule.Key(vals), Cost: rv.cost(rule), Limit: rule.Limit, policy: s.policy[i]}
		if rule.Mode == rules.Shadow {
			sh = append(sh, a)
		} else {
			enf = append(enf, a)
		}
	}
	res := &Result{Allowed: true}
	l.enforce(ctx, s, res, enf)
	l.shadow(ctx, s, res, sh)
	res.Applied = append(enf, sh...)
	for i := range res.Applied {
		a := &res.Applied[i]
		l.obs.Decision(a.Rule.Name, a.Rule.Mode, a.Outcome)
	}
	res.pick(rv)
	return res
}

func (l *Limiter) enforce(ctx context.Context, s *snapshot, res *Result, enf []Applied) {
	if len(enf) == 0 {
		return
	}
	over := -1
	for i := range enf {
		if enf[i].Cost > burst(enf[i].Limit) {
			over = i
			break
		}
	}
	reqs := make([]drip.Request, len(enf))
	for i, a := range enf {
		reqs[i] = drip.Request{Key: a.Key, Limit: a.Limit, Cost: a.Cost}
	}
	if over >= 0 {
		// A cost above the burst can never be allowed: deny it without
		// taking anything, and peek (cost 0) for the headers.
		res.deny(http.StatusTooManyRequests, ReasonCostExceedsBurst)
		for i := range reqs {
			reqs[i].Cost = 0
		}
		m, err := l.apply(ctx, s, drip.OpPeek, reqs)
		for i := range enf {
			a := &enf[i]
			a.Outcome = NotTaken
			if err == nil {
				a.Decision, a.Decided = m.Decisions[i], true
			}
		}
		a := &enf[over]
		a.Outcome, a.Reason = Denied, ReasonCostExceedsBurst
		a.Decision.Allowed = false
		return
	}
	var m drip.Multi
	var err error
	var evaluated []bool
	if l.separate && len(reqs) > 1 {
		m, evaluated, err = l.takeSeparately(ctx, s, reqs)
	} else {
		m, err = l.apply(ctx, s, drip.OpTake, reqs)
	}
	if err != nil {
		res.Err = err
		l.fail(ctx, res, enf, reqs)
		return
	}
	l.settle(res, enf, m, false)
	for i, ok := range evaluated {
		if !ok {
			enf[i].Decided = false
		}
	}
}

// takeSeparately takes each request in its own store call, in order, for
// stores that cannot take several keys in one atomic step (WithSeparateTakes).
// When one is denied, those already taken are refunded, and the rest are
// not evaluated. On an error the ones taken are refunded too.
func (l *Limiter) takeSeparately(ctx context.Context, s *snapshot, reqs []drip.Request) (drip.Multi, []bool, error) {
	ds := make([]drip.Decision, len(reqs))
	evaluated := make([]bool, len(reqs))
	refund := func(n int) {
		for j := range n {
			if _, err := l.apply(ctx, s, drip.OpRefund, reqs[j:j+1]); err != nil {
				return // the store is failing; the breaker will know
			}
		}
	}
	for i := range reqs {
		m, err := l.apply(ctx, s, drip.OpTake, reqs[i:i+1])
		if err != nil {
			refund(i)
			return drip.Multi{}, nil, err
		}
		ds[i], evaluated[i] = m.Decisions[0], true
		if !ds[i].Allowed {
			refund(i)
			// Report the rest as allowed by their own (unknown) buckets:
			// they were not evaluated and show in no header.
			for j := i + 1; j < len(reqs); j++ {
				ds[j].Allowed = true
			}
			return drip.Combine(ds), evaluated, nil
		}
	}
	return drip.Combine(ds), evaluated, nil
}

// settle records a multi-take's decisions in enf and res.
func (l *Limiter) settle(res *Result, enf []Applied, m drip.Multi, local bool) {
	allowed, denied := Allowed, Denied
	if local {
		allowed, denied = LocalAllowed, LocalDenied
	}
	for i := range enf {
		a := &enf[i]
		a.Decision, a.Decided, a.Local = m.Decisions[i], true, local
		switch {
		case !a.Decision.Allowed:
			a.Outcome, a.Reason = denied, reasonOf(a.Limit)
		case m.Allowed:
			a.Outcome = allowed
		default:
			a.Outcome = NotTaken
			a.Decision = untake(a.Decision, a.Limit, a.Cost)
		}
	}
	if !m.Allowed {
		res.deny(http.StatusTooManyRequests, "")
	}
}

// untake turns the decision of a request that its own bucket allowed but
// that was not taken (another rule denied it) into the bucket as it is:
// a multi-take reports the tokens each request would have left, but the
// headers must show what is left. The cost is added back to the tokens,
// and the time to fill shortened by the time the cost takes to refill
// (whole periods on a grid).
func untake(d drip.Decision, l drip.Limit, cost float64) drip.Decision {
	c := int64(math.Round(cost * drip.Micro))
	if c == 0 {
		return d
	}
	after := int64(math.Round(d.Tokens * drip.Micro))
	avail := after + c
	d.Tokens = float64(avail) / drip.Micro
	d.Remaining = max(0, avail) / drip.Micro
	b := int64(math.Round(burst(l) * drip.Micro))
	r := int64(math.Round(l.Rate * drip.Micro))
	p := l.Period
	if p == 0 {
		p = time.Second
	}
	var back time.Duration
	if l.Algorithm == drip.FixedWindow || l.Refill == drip.Interval {
		periods := func(x int64) int64 {
			if x >= b {
				return 0
			}
			return (b - x + r - 1) / r
		}
		back = time.Duration(periods(after)-periods(avail)) * p
	} else {
		back = time.Duration(float64(c) * float64(p) / float64(r))
	}
	d.ResetAfter = max(0, d.ResetAfter-back)
	return d
}

// fail applies the rules' fail policies after the store failed.
func (l *Limiter) fail(ctx context.Context, res *Result, enf []Applied, reqs []drip.Request) {
	for i := range enf {
		if enf[i].Rule.OnError == rules.Deny {
			res.deny(http.StatusServiceUnavailable, ReasonStoreUnavailable)
			for j := range enf {
				enf[j].Outcome = NotTaken
			}
			enf[i].Outcome, enf[i].Reason = ErrorDenied, ReasonStoreUnavailable
			return
		}
	}
	var idx []int
	for i := range enf {
		if enf[i].Rule.OnError == rules.Local {
			idx = append(idx, i)
		} else {
			enf[i].Outcome = ErrorAllowed
		}
	}
	if len(idx) == 0 {
		return
	}
	loc := make([]Applied, len(idx))
	lreqs := make([]drip.Request, len(idx))
	for j, i := range idx {
		a := enf[i]
		a.Limit = share(a.Limit, a.Rule.LocalShare)
		a.policy = policyItem(a.Rule.Name, a.Limit)
		loc[j] = a
		lreqs[j] = drip.Request{Key: a.Key, Limit: a.Limit, Cost: a.Cost}
	}
	for j := range loc {
		if loc[j].Cost > burst(loc[j].Limit) {
			res.deny(http.StatusTooManyRequests, ReasonCostExceedsBurst)
			for k := range loc {
				loc[k].Outcome, loc[k].Local = NotTaken, true
			}
			loc[j].Outcome, loc[j].Reason = LocalDenied, ReasonCostExceedsBurst
			copyBack(enf, idx, loc)
			return
		}
	}
	m, err := l.localStore().ApplyMulti(ctx, drip.OpTake, l.at(), lreqs)
	if err != nil { // cannot happen with validated rules; fail open
		l.logError("local fallback", err)
		for j := range loc {
			loc[j].Outcome = ErrorAllowed
		}
		copyBack(enf, idx, loc)
		return
	}
	l.settle(res, loc, m, true)
	copyBack(enf, idx, loc)
}

func copyBack(enf []Applied, idx []int, loc []Applied) {
	for j, i := range idx {
		enf[i] = loc[j]
	}
}

func (l *Limiter) shadow(ctx context.Context, s *snapshot, res *Result, sh []Applied) {
	var reqs []drip.Request
	var idx []int
	for i := range sh {
		a := &sh[i]
		if a.Cost > burst(a.Limit) {
			a.Outcome, a.Reason = Denied, ReasonCostExceedsBurst
			continue
		}
		reqs = append(reqs, drip.Request{Key: a.Key, Limit: a.Limit, Cost: a.Cost})
		idx = append(idx, i)
	}
	if len(reqs) == 0 {
		return
	}
	if res.Err != nil { // the store just failed: spare the request a second deadline
		for _, i := range idx {
			sh[i].Outcome = ErrorAllowed
		}
		return
	}
	op := drip.OpTake
	if !res.Allowed {
		op = drip.OpPeek
	}
	m, err := l.apply(ctx, s, op, reqs)
	for j, i := range idx {
		a := &sh[i]
		switch {
		case err != nil:
			a.Outcome = ErrorAllowed
		case !m.Decisions[j].Allowed:
			a.Decision, a.Decided = m.Decisions[j], true
			a.Outcome, a.Reason = Denied, reasonOf(a.Limit)
		case op == drip.OpTake && !m.Allowed:
			a.Decision, a.Decided = m.Decisions[j], true
			a.Outcome = NotTaken
		default:
			a.Decision, a.Decided = m.Decisions[j], true
			a.Outcome = Allowed
		}
	}
}

func (res *Result) deny(status int, reason string) {
	if !res.Allowed {
		return
	}
	res.Allowed, res.Status, res.Reason = false, status, reason
}

// pick chooses the rule the single-value headers describe, the reason,
// the identity and Retry-After.
func (res *Result) pick(rv *reqValues) {
	var top *Applied
	for i := range res.Applied {
		a := &res.Applied[i]
		if a.Rule.Mode == rules.Shadow {
			continue
		}
		if !res.Allowed {
			if a.Reason == "" {
				continue
			}
			if top == nil || a.Decision.RetryAfter > top.Decision.RetryAfter {
				top = a
			}
			continue
		}
		if !a.Decided {
			continue
		}
		if top == nil || a.Decision.Remaining < top.Decision.Remaining ||
			(a.Decision.Remaining == top.Decision.Remaining && a.Decision.ResetAfter > top.Decision.ResetAfter) {
			top = a
		}
	}
	res.Top = top
	if res.Allowed || top == nil {
		return
	}
	if res.Reason == "" {
		res.Reason = top.Reason
	}
	res.Identity = rv.identity(top.Key)
	if res.Status == http.StatusTooManyRequests && res.Reason != ReasonCostExceedsBurst {
		var retry time.Duration
		for _, a := range res.Applied {
			if a.Rule.Mode != rules.Shadow && a.Reason != "" {
				retry = max(retry, a.Decision.RetryAfter)
			}
		}
		res.RetryAfter = rv.s.set.RetryJitter.Seconds(res.Identity, retry)
	}
}

func reasonOf(l drip.Limit) string {
	if l.Algorithm == drip.FixedWindow {
		return ReasonFixedWindow
	}
	return ReasonTokenBucket
}

func burst(l drip.Limit) float64 {
	if l.Burst == 0 {
		return l.Rate
	}
	return l.Burst
}

// share is the local fallback's limit: share of the rate and the burst,
// with a burst of at least one token (or the whole burst, if smaller) so
// that a small bucket's fallback still admits requests of cost 1.
func share(l drip.Limit, f float64) drip.Limit {
	if f <= 0 || f > 1 {
		f = rules.DefaultLocalShare
	}
	b := burst(l)
	l.Burst = max(b*f, min(b, 1))
	l.Rate *= f
	return l
}

// localMaxKeys bounds the local fallback's memory.
const localMaxKeys = 1 << 16

func (l *Limiter) localStore() *memstore.Store {
	l.localMu.Lock()
	defer l.localMu.Unlock()
	if l.local == nil {
		if l.closed { // no sweeper goroutine may outlive Close
			l.local = memstore.New(memstore.WithMaxKeys(localMaxKeys), memstore.WithSweep(0))
		} else {
			l.local = memstore.New(memstore.WithMaxKeys(localMaxKeys))
		}
	}
	return l.local
}

func (l *Limiter) at() time.Time {
	if l.now == nil {
		return time.Time{}
	}
	return l.now()
}

func (l *Limiter) clock() time.Time {
	if l.now == nil {
		return time.Now()
	}
	return l.now()
}

// apply makes one store call, behind the breaker and with a deadline.
func (l *Limiter) apply(ctx context.Context, s *snapshot, op drip.Op, reqs []drip.Request) (drip.Multi, error) {
	now := l.clock()
	ok, tk, changed := l.brk.allow(now)
	l.breakerChanged(changed)
	if !ok {
		return drip.Multi{}, ErrBreakerOpen
	}
	cctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	start := time.Now()
	var m drip.Multi
	var err error
	if len(reqs) == 1 {
		var d drip.Decision
		d, err = l.store.Apply(cctx, op, l.at(), reqs[0])
		if err == nil {
			m = drip.Combine([]drip.Decision{d})
		}
	} else {
		m, err = l.store.ApplyMulti(cctx, op, l.at(), reqs)
	}
	l.obs.StoreLatency(time.Since(start))
	if err == nil && len(m.Decisions) != len(reqs) {
		err = errors.New("httplimit: the store returned a wrong number of decisions")
	}
	if err != nil {
		l.obs.StoreError(err)
		l.logError("store call failed", err)
		if ctx.Err() == nil {
			l.breakerChanged(l.brk.failure(l.clock(), s.breaker.Failures, s.breaker.Cooldown, tk))
		} else {
			// The caller gave up: not the store's fault, so nothing is
			// counted; a probe frees its place for the next call.
			l.brk.abandon(tk)
		}
		return drip.Multi{}, err
	}
	l.breakerChanged(l.brk.success(tk))
	return m, nil
}

func (l *Limiter) breakerChanged(state string) {
	if state == "" {
		return
	}
	l.obs.BreakerState(state)
	l.log.Warn("httplimit: store circuit breaker "+state, "state", state)
}

// logError logs at most one error a second, so that an outage does not
// flood the log (the observer counts every one).
func (l *Limiter) logError(msg string, err error) {
	now := time.Now().UnixNano()
	last := l.lastLog.Load()
	if now-last < int64(time.Second) || !l.lastLog.CompareAndSwap(last, now) {
		return
	}
	l.log.Warn("httplimit: "+msg, "err", err)
}

// reqValues reads a request's values, each at most once.
type reqValues struct {
	r *http.Request
	s *snapshot

	ipDone bool
	ip     netip.Addr
	ipOK   bool

	queryDone bool
	query     url.Values

	claimsDone bool
	claims     jwt.MapClaims

	pathDone bool
	path     string
}

func (v *reqValues) get(src rules.Source) (string, bool) {
	switch src.Kind {
	case rules.KindIP:
		a, ok := v.clientIP()
		if !ok {
			return "", false
		}
		return KeyIP(a, v.s.set.IPv6Prefix), true
	case rules.KindHeader:
		return joined(v.r.Header[src.Name])
	case rules.KindQuery:
		if !v.queryDone {
			v.query, v.queryDone = v.r.URL.Query(), true
		}
		return joined(v.query[src.Name])
	case rules.KindJWT:
		x, ok := v.jwtClaims()[src.Name]
		if !ok {
			return "", false
		}
		return claimText(x)
	case rules.KindPath:
		return v.cleanPath(), true
	case rules.KindMethod:
		return v.r.Method, true
	case rules.KindCookie:
		var vals []string
		for _, c := range v.r.CookiesNamed(src.Name) {
			vals = append(vals, c.Value)
		}
		return joined(vals)
	case rules.KindGlobal:
		return "", true
	}
	return "", false
}

// joined is the value of a header, query parameter or cookie that a
// request may repeat: all of its values, joined with ", " (as HTTP joins
// repeated header lines), so that a request with two x-api-key headers is
// keyed on both, never on the one drip happened to read first (the
// upstream might believe the other); and a cost read from two values is
// not a number, so default_cost applies.
func joined(vals []string) (string, bool) {
	switch len(vals) {
	case 0:
		return "", false
	case 1:
		return vals[0], true
	}
	return strings.Join(vals, ", "), true
}

func (v *reqValues) clientIP() (netip.Addr, bool) {
	if !v.ipDone {
		v.ip, v.ipOK = ClientIP(v.r, v.s.set.TrustedProxies)
		v.ipDone = true
	}
	return v.ip, v.ipOK
}

func (v *reqValues) jwtClaims() jwt.MapClaims {
	if !v.claimsDone {
		v.claimsDone = true
		if v.s.jwt != nil {
			v.claims = v.s.jwt.claims(v.r)
		}
	}
	return v.claims
}

// cleanPath is the URL path as the upstream will route it: "/a/../b" is
// "/b", so that a match on "/api/*" cannot be dodged; a trailing slash is
// kept.
func (v *reqValues) cleanPath() string {
	if !v.pathDone {
		p := v.r.URL.Path
		switch {
		case p == "":
			v.path = "/"
		case p[0] != '/':
			v.path = p // "*" of OPTIONS *
		default:
			v.path = path.Clean(p)
			if strings.HasSuffix(p, "/") && v.path != "/" {
				v.path += "/"
			}
		}
		v.pathDone = true
	}
	return v.path
}

// cost is the request's cost under rule.
func (v *reqValues) cost(rule *rules.Rule) float64 {
	if rule.CostSource.Kind == rules.KindFixed {
		return rule.FixedCost
	}
	if s, ok := v.get(rule.CostSource); ok {
		if c, ok := ParseCost(s); ok {
			return c
		}
	}
	return rule.DefaultCost
}

// identity is the client identity that seeds the Retry-After jitter.
func (v *reqValues) identity(key string) string {
	if v.s.jwt != nil {
		if sub, ok := v.jwtClaims()["sub"].(string); ok && sub != "" {
			return "sub:" + sub
		}
	}
	if a, ok := v.clientIP(); ok {
		return "ip:" + KeyIP(a, v.s.set.IPv6Prefix)
	}
	return "key:" + key
}
