// Package httplimit is drip's net/http middleware. It applies a rules
// file (package rules) to each request, with state in any store.Store.
//
// Every rule whose match holds applies, in file order. Within a group
// only the first matching rule applies (tiers). A rule whose limit key
// has no value in the request does not apply; the next rule of its group
// may. The enforce rules that apply are taken all or nothing in one
// store call. If any denies, none is consumed. The answer is then a 429
// with RateLimit headers, a jittered Retry-After and a problem+json body.
//
// Shadow rules are decided and counted but never block. They are taken
// in a second store call, after the enforce rules allowed the request.
// They never consume the enforce rules' tokens. On a denial they are only
// peeked.
//
// When the store fails or misses its deadline, each rule's on_error
// decides: allow, deny (503), or local (a memory limiter in each
// instance). A circuit breaker stops calling a store that keeps failing.
// After its cooldown one probe goes through; only its success closes the
// breaker. Adaptive rules learn their limit from the responses, and a
// denial the store proved is repeated without a store call.
//
// NewKeyLimiter is the middleware without a rules file. A key function
// says who is calling, and one limit applies to each key (KeyLimit).
// It behaves as one rule keyed by that value would.
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

// Status returns the HTTP status of the answer to out: 0 when allowed,
// 429 over a limit, 503 when the store failed and on_error denied. A
// request refused before any rule was decided gets 400
// (ReasonAmbiguousPath), or 500 when its key function failed
// (ReasonKeyError).
func Status(out *engine.Outcome) int { return frontdoor.Status(out) }

// WriteHeaders sets the RateLimit headers, and Retry-After on a 429. It
// writes nothing when no enforce rule was decided.
func WriteHeaders(h http.Header, out *engine.Outcome) { frontdoor.WriteHeaders(h, out) }

// WriteError writes the status and problem+json body of a denial. Call
// WriteHeaders first.
func WriteError(w http.ResponseWriter, out *engine.Outcome) { frontdoor.WriteError(w, out) }

// WriteErrorAs writes the problem+json body of a denial under status. It
// serves callers that pass on only some statuses, such as nginx's
// auth_request (401 and 403). The body keeps the denial's own status.
// Call WriteHeaders first.
func WriteErrorAs(w http.ResponseWriter, out *engine.Outcome, status int) {
	frontdoor.WriteErrorAs(w, out, status)
}

// ProblemOf returns the problem details of a denial.
func ProblemOf(out *engine.Outcome) Problem { return frontdoor.ProblemOf(out) }

// ProblemJSON returns the problem+json body of a denial, without the
// final newline.
func ProblemJSON(out *engine.Outcome) []byte { return frontdoor.ProblemJSON(out) }

// Result is a decision with its HTTP form as methods.
//
// Deprecated: Decide returns the *engine.Outcome itself; render it with
// Status, WriteHeaders, WriteError, WriteErrorAs, ProblemOf and
// ProblemJSON. Result{Outcome: out} still works.
type Result struct {
	*engine.Outcome
}

// Status is Status(r.Outcome).
//
// Deprecated: use Status.
func (r Result) Status() int { return Status(r.Outcome) }

// WriteHeaders is WriteHeaders(h, r.Outcome).
//
// Deprecated: use WriteHeaders.
func (r Result) WriteHeaders(h http.Header) { WriteHeaders(h, r.Outcome) }

// WriteError is WriteError(w, r.Outcome).
//
// Deprecated: use WriteError.
func (r Result) WriteError(w http.ResponseWriter) { WriteError(w, r.Outcome) }

// WriteErrorAs is WriteErrorAs(w, r.Outcome, status).
//
// Deprecated: use WriteErrorAs.
func (r Result) WriteErrorAs(w http.ResponseWriter, status int) {
	WriteErrorAs(w, r.Outcome, status)
}

// Problem is ProblemOf(r.Outcome).
//
// Deprecated: use ProblemOf.
func (r Result) Problem() Problem { return ProblemOf(r.Outcome) }

// ProblemJSON is ProblemJSON(r.Outcome).
//
// Deprecated: use ProblemJSON.
func (r Result) ProblemJSON() []byte { return ProblemJSON(r.Outcome) }

// Limiter applies a rules Set to HTTP requests. It is safe for concurrent
// use; Swap replaces its rules atomically. Construct it with New.
type Limiter struct {
	fd *frontdoor.Door
}

// Option configures a Limiter: it is an engine option (engine.WithLogger,
// engine.WithObserver, engine.WithTimeout, engine.WithClock, ...). With
// engine.Shared the limiter decides with an engine shared by other
// doors, and the other options are that engine's.
type Option = engine.Option

// WithEngine is engine.Shared(e).
//
// Deprecated: use engine.Shared.
func WithEngine(e *engine.Engine) Option { return engine.Shared(e) }

// WithLogger is engine.WithLogger(log).
//
// Deprecated: use engine.WithLogger.
func WithLogger(log *slog.Logger) Option { return engine.WithLogger(log) }

// WithObserver is engine.WithObserver(obs).
//
// Deprecated: use engine.WithObserver.
func WithObserver(obs engine.Observer) Option { return engine.WithObserver(obs) }

// WithTimeout is engine.WithTimeout(d).
//
// Deprecated: use engine.WithTimeout.
func WithTimeout(d time.Duration) Option { return engine.WithTimeout(d) }

// WithSeparateTakes is engine.WithSeparateTakes().
//
// Deprecated: use engine.WithSeparateTakes.
func WithSeparateTakes() Option { return engine.WithSeparateTakes() }

// WithTracerProvider is engine.WithTracerProvider(tp).
//
// Deprecated: use engine.WithTracerProvider.
func WithTracerProvider(tp trace.TracerProvider) Option { return engine.WithTracerProvider(tp) }

// WithClock is engine.WithClock(now).
//
// Deprecated: use engine.WithClock.
func WithClock(now func() time.Time) Option { return engine.WithClock(now) }

// New returns a Limiter that applies set with state in store. A nil set
// means rules.Default().
func New(store store.Store, set *rules.Set, opts ...Option) *Limiter {
	return &Limiter{fd: frontdoor.New(store, "httplimit", set, opts)}
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

// Handler returns next behind the limiter. A denied request gets its
// status (Status) and never reaches next. Every request that enforce
// rules decided gets the RateLimit headers.
func (l *Limiter) Handler(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		serve(w, r, next, l.Decide(r.Context(), r), l.fd)
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

// Decide decides r without writing a response, for callers that answer
// requests themselves. It takes the tokens of an allowed request. Render
// the outcome with Status, WriteHeaders and WriteError.
//
// A path that servers read in different ways (an encoded NUL, a double
// encoding) is refused when a rule reads the path: the outcome is a 400
// with the reason ReasonAmbiguousPath, and nothing is taken.
func (l *Limiter) Decide(ctx context.Context, r *http.Request) *engine.Outcome {
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

// ParseCost is engine.ParseCost(s).
//
// Deprecated: use engine.ParseCost.
func ParseCost(s string) (float64, bool) { return engine.ParseCost(s) }
