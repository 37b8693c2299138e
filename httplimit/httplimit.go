// Package httplimit is drip's net/http middleware: it applies a rules file
// (package rules) to each request, with bucket state in any store.Store.
//
// For each request, in file order, every rule whose match holds applies,
// except that within a group only the first matching rule does (tiers). A
// rule whose limit key has no value in the request (no such header, no
// verified claim) does not apply, and the next rule of its group may. The
// enforce rules that apply are taken all or nothing in one store call
// (store.Store.Apply): if any denies, none is consumed, and the answer is 429
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
//
// NewKeyLimiter is the middleware without a rules file: a key function
// that says who is calling (the user in the request's context, an API
// key) and one limit (KeyLimit), decided as one rule keyed by that value
// would be, with the same headers, 429 body, fail policy and metrics.
package httplimit

import (
	"context"
	"log/slog"
	"net/http"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/driplimit/drip/engine"
	"github.com/driplimit/drip/internal/door/frontdoor"
	"github.com/driplimit/drip/rules"
	"github.com/driplimit/drip/store"
)

// ReasonAmbiguousPath is the reason of a 400: a request whose path
// servers read in different ways, refused when a rule reads the path
// (rules.Set.CleanPath). The other reasons are the engine's
// (engine.ReasonTokenBucket, ...).
const ReasonAmbiguousPath = "ambiguous_path"

// Problem is the application/problem+json body of a denial.
type Problem = frontdoor.Problem

// Result is the middleware's answer on one request: the engine's
// decision (engine.Outcome: allowed, the rules that applied, the
// RateLimit values, Retry-After, the reason) and its HTTP form (Status,
// WriteHeaders, WriteError).
type Result struct {
	*engine.Outcome
}

// Status is the HTTP status of the answer: 0 when allowed, 429 over a
// limit, 503 when the store failed and on_error denied, 400 for a
// request refused before any rule was decided (ReasonAmbiguousPath).
func (r Result) Status() int { return frontdoor.Status(r.Outcome) }

// WriteHeaders sets the RateLimit headers (and Retry-After on a 429) for
// the enforce rules that were decided. It writes nothing when none was
// (no rule applied, or the store failed and on_error allowed).
func (r Result) WriteHeaders(h http.Header) { frontdoor.WriteHeaders(h, r.Outcome) }

// WriteError writes the status and problem+json body of a denied
// request. Call WriteHeaders first.
func (r Result) WriteError(w http.ResponseWriter) { frontdoor.WriteError(w, r.Outcome) }

// WriteErrorAs writes the problem+json body of a denied request under
// status instead of its own (Status), for a front door whose caller
// passes on only some statuses (nginx's auth_request: 401 and 403). The
// body still says the denial's status. Call WriteHeaders first.
func (r Result) WriteErrorAs(w http.ResponseWriter, status int) {
	frontdoor.WriteErrorAs(w, r.Outcome, status)
}

// Problem returns the problem details of a denied request.
func (r Result) Problem() Problem { return frontdoor.ProblemOf(r.Outcome) }

// ProblemJSON is the problem+json body of a denied request, without the
// final newline.
func (r Result) ProblemJSON() []byte { return frontdoor.ProblemJSON(r.Outcome) }

// Limiter applies a rules Set to HTTP requests. It is safe for concurrent
// use; Swap replaces its rules atomically. Construct it with New.
type Limiter struct {
	fd *frontdoor.Door
}

// Option configures a Limiter.
type Option = frontdoor.Option

// WithEngine makes the limiter decide with e, sharing its store, breaker,
// observer and deadline with other front doors; the options that
// configure an engine (WithLogger, WithObserver, WithTimeout,
// WithSeparateTakes, WithTracerProvider) are then e's, and WithClock sets only the clock of
// token expiry.
func WithEngine(e *engine.Engine) Option { return frontdoor.WithEngine(e) }

// WithLogger sets the logger for store failures and breaker changes
// (default slog.Default()).
func WithLogger(log *slog.Logger) Option {
	return frontdoor.WithEngineOption(engine.WithLogger(log))
}

// WithObserver sets the observer of decisions, store calls and the
// breaker.
func WithObserver(obs engine.Observer) Option {
	return frontdoor.WithEngineOption(engine.WithObserver(obs))
}

// WithTimeout sets the deadline of each store call (default
// engine.DefaultTimeout). A rules file's store_timeout takes precedence.
func WithTimeout(d time.Duration) Option {
	return frontdoor.WithEngineOption(engine.WithTimeout(d))
}

// WithSeparateTakes is for stores that cannot take several keys in one
// atomic step, such as Redis Cluster (whose multi-takes need every key in
// one hash slot, while rules' keys land anywhere): the enforce rules of a
// request are taken one store call each, in file order (store.Separately),
// and when one denies, those already taken are given back, tokens and
// slots, and the rest are peeked at for the headers. Without the option, a
// store that answers a multi-take with store.ErrNotColocated gets the same
// treatment, after a first attempt that the store refuses without a round
// trip. The answers are those of one atomic multi-take; all or nothing
// holds in the end rather than at every instant: between a take and its
// give-back, another request may find fewer tokens or slots.
func WithSeparateTakes() Option {
	return frontdoor.WithEngineOption(engine.WithSeparateTakes())
}

// WithTracerProvider makes the limiter trace its decisions with tp: a
// drip.decide span per request, a child of the span in the request's
// context, and a drip.store span per store call (engine.WithTracerProvider).
// Nil, the default, traces nothing. The middleware neither reads nor
// writes trace headers: put it behind the handler that does (drip serve's
// gateway does both).
func WithTracerProvider(tp trace.TracerProvider) Option {
	return frontdoor.WithEngineOption(engine.WithTracerProvider(tp))
}

// WithClock makes the limiter pass now() as the time of each decision
// (instead of the store's clock), and use it for token expiry and the
// circuit breaker.
func WithClock(now func() time.Time) Option { return frontdoor.WithClock(now) }

// New returns a Limiter that applies set with state in store. A nil set
// means rules.Default().
func New(store store.Store, set *rules.Set, opts ...Option) *Limiter {
	return &Limiter{fd: frontdoor.New(store, "httplimit", set, frontdoor.Configure(opts))}
}

// Swap makes set the rules of every request from now on. Requests in
// flight finish with the rules they started with. Bucket keys depend only
// on rule names and key values, so a rule that keeps its name keeps its
// buckets.
func (l *Limiter) Swap(set *rules.Set) { l.fd.Swap(set) }

// Rules returns the rules in force.
func (l *Limiter) Rules() *rules.Set { return l.fd.Snapshot().Rules.Set }

// Store returns the limiter's store.
func (l *Limiter) Store() store.Store { return l.fd.Engine().Store() }

// Engine returns the engine the limiter decides with.
func (l *Limiter) Engine() *engine.Engine { return l.fd.Engine() }

// BreakerState returns the circuit breaker's state.
func (l *Limiter) BreakerState() string { return l.fd.Engine().BreakerState() }

// Close releases the local fallback's memory store, if one was started.
func (l *Limiter) Close() error { return l.fd.Engine().Close() }

// Handler returns next behind the limiter: a request over an enforce
// rule's limit gets 429 (or 503 when the store fails and on_error is deny)
// and never reaches next; every request that enforce rules decided gets
// the RateLimit headers.
func (l *Limiter) Handler(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		serve(w, r, next, l.decide(r.Context(), r), l.fd)
	})
}

// serve writes res's headers, and its error or next's response.
//
// Rules that know the response (cost_from_response, count_status) are
// settled when next returns, with its status, its headers as it sent
// them and its trailers (Errored: a request that was not served).
//
// The slots of concurrency rules are held while next runs and given back
// when it returns, however it ends: normally, by a panic (deferred calls
// run, and the panic goes on), or because the client went away and it
// gave up. Release uses a context of its own, so a cancelled request
// still releases.
//
// Where a rule reads a model server's API (openai, anthropic), the
// answer also carries that API's rate limit headers, and a denial is
// that API's error, which its SDKs read.
func serve(w http.ResponseWriter, r *http.Request, next http.Handler, out *engine.Outcome, fd *frontdoor.Door) {
	defer func() { _ = out.Release(r.Context()) }()
	frontdoor.WriteHeaders(w.Header(), out)
	api := fd != nil && fd.Snapshot().APIs && frontdoor.API(out) != ""
	if api {
		frontdoor.WriteAPIHeaders(w.Header(), out, fd.Now())
	}
	if !out.Allowed {
		if api {
			frontdoor.WriteAPIError(w, out)
		} else {
			frontdoor.WriteError(w, out)
		}
		return
	}
	if out.Learns() { // an adaptive rule learns from the response (adaptive.go)
		var done func(bool)
		w, done = watchDrops(w, r, out)
		ended := false
		defer func() { done(ended) }() // a panic: not ended
		serveNext(w, r, next, out)
		ended = true
		return
	}
	serveNext(w, r, next, out)
}

func serveNext(w http.ResponseWriter, r *http.Request, next http.Handler, out *engine.Outcome) {
	if out.Settles() { // settle.go
		serveSettled(w, r, next, out)
		return
	}
	next.ServeHTTP(w, r)
}

// Decide decides r without writing a response: the middleware's work,
// for callers that answer requests themselves. It takes the tokens of an
// allowed request.
//
// When a rule matches or keys on the path, r's path is read as
// rules.Set.CleanPath reads it, and a path that servers read in different
// ways (an encoded NUL, a double encoding, ...) is refused: the Result is
// a 400 with the reason ReasonAmbiguousPath, and nothing is taken.
func (l *Limiter) Decide(ctx context.Context, r *http.Request) Result {
	return Result{l.decide(ctx, r)}
}

func (l *Limiter) decide(ctx context.Context, r *http.Request) *engine.Outcome {
	s := l.fd.Snapshot()
	v := newReqValues(s, r)
	if s.ReadsPath {
		p, err := s.Rules.Set.CleanPath(escapedPath(r.URL))
		if err != nil {
			return engine.Refuse(ReasonAmbiguousPath, err.Error())
		}
		v.path = p
	}
	return l.fd.Engine().Decide(ctx, s.Rules, v)
}

// ParseCost reads a request's cost (engine.ParseCost).
func ParseCost(s string) (float64, bool) { return engine.ParseCost(s) }
