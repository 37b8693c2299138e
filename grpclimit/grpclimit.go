// Package grpclimit is drip's gRPC server interceptors. They apply a
// rules file (package rules) to each call, with state in any
// store.Store. They decide through the same engine, with the same rules,
// as the net/http middleware (package httplimit).
//
// A rule's sources read a call this way:
//
//	header:<name>   the incoming metadata <name> (gRPC metadata names are lower case)
//	path            the full method, "/pkg.Service/Method": match "/pkg.Service/*" for a whole service
//	method          "POST", the HTTP method of every gRPC call
//	ip:address      the peer address; x-forwarded-for metadata only from a trusted proxy
//	jwt:<claim>     a verified claim of the bearer token in the authorization metadata
//	global          one bucket for every call
//	query, cookie   no value: a rule keyed or matched on them does not apply
//
// A unary call is decided before its handler runs. A stream is decided
// once, when it opens; its messages are not counted. A denied call never
// reaches the handler: it fails with the status Status returns. Every
// call that enforce rules decided gets the RateLimit values in its
// response header metadata (Metadata).
package grpclimit

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"go.opentelemetry.io/otel/trace"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/driplimit/drip/engine"
	"github.com/driplimit/drip/internal/door/frontdoor"
	"github.com/driplimit/drip/rules"
	"github.com/driplimit/drip/store"
)

// ErrorDomain is the domain of the google.rpc.ErrorInfo detail of a
// denied call.
const ErrorDomain = "drip"

// Limiter applies a rules Set to gRPC calls. It is safe for concurrent
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
	return &Limiter{fd: frontdoor.New(store, "grpclimit", set, opts)}
}

// Swap makes set the rules of every call from now on. Calls in flight
// finish with the rules they started with; a rule that keeps its name
// keeps its buckets.
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

// UnaryInterceptor returns the interceptor that limits unary calls:
// install it with grpc.UnaryInterceptor or grpc.ChainUnaryInterceptor.
func (l *Limiter) UnaryInterceptor() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (resp any, err error) {
		err = l.guard(ctx, info.FullMethod, func(md metadata.MD) error { return grpc.SetHeader(ctx, md) },
			func(w *watched) error {
				if w != nil {
					ctx = w.context(ctx)
				}
				resp, err = handler(ctx, req)
				return err
			})
		return resp, err
	}
}

// StreamInterceptor returns the interceptor that limits streams, once
// when each opens: install it with grpc.StreamInterceptor or
// grpc.ChainStreamInterceptor.
func (l *Limiter) StreamInterceptor() grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		return l.guard(ss.Context(), info.FullMethod, ss.SetHeader, func(w *watched) error {
			if w != nil {
				ss = &stream{ServerStream: ss, w: w, ctx: w.context(ss.Context())}
			}
			return handler(srv, ss)
		})
	}
}

// guard decides a call, sets its response header metadata, and runs it
// if allowed: the one place where both interceptors meet the handler.
//
// A call with rules settled when it ends (cost_from_response: a header
// or trailer the handler sets; count_status: its code as an HTTP status,
// HTTPStatus) runs with what it sends back watched (run's w, else nil),
// and is settled when the handler returns, or panics (then as a call
// that errored: nothing taken).
func (l *Limiter) guard(ctx context.Context, fullMethod string, setHeader func(metadata.MD) error, run func(w *watched) error) (err error) {
	out := l.Decide(ctx, fullMethod)
	// The slots of concurrency rules are held while the handler runs and
	// given back when it returns, however it ends (an error, a panic, a
	// cancelled call), on a context of their own (Outcome.Release).
	defer func() { _ = out.Release(ctx) }()
	if md := Metadata(out); len(md) > 0 {
		// It fails only where there is no server stream (the interceptor
		// called outside a server) or its headers went already, which
		// cannot be before the handler ran: the decision stands either way.
		_ = setHeader(md)
	}
	if !out.Allowed {
		return Status(out).Err()
	}
	if out.Learns() {
		// An adaptive rule learns from how the call ends: a code that
		// tells of overload (its drop_status, as HTTPStatus reads the
		// code) or a panic is a drop; a call its caller cancelled
		// teaches nothing, whatever the handler returned
		// (engine.Outcome.Abandon). Deferred after the release, so run
		// before it.
		ended := false
		defer func() {
			switch {
			case !ended:
				out.Drop()
			case errors.Is(ctx.Err(), context.Canceled):
				out.Abandon()
			case out.Drops(HTTPStatus(status.Code(err))):
				out.Drop()
			}
		}()
		err = l.run(ctx, out, run)
		ended = true
		return err
	}
	return l.run(ctx, out, run)
}

// run runs the call's handler, watched when a rule settles on it.
func (l *Limiter) run(ctx context.Context, out *engine.Outcome, run func(w *watched) error) (err error) {
	// The one place where the handler runs: the release deferred above
	// comes when it returns.
	if !out.Settles() {
		return run(nil)
	}
	w := &watched{}
	ended := false
	defer func() {
		resp := engine.Response{} // a panic: errored
		if ended {
			resp = w.response(err)
		}
		_ = out.Settle(ctx, resp)
	}()
	err = run(w)
	ended = true
	return err
}

// Decide decides a call to fullMethod ("/pkg.Service/Method") without
// answering it, for callers that answer by themselves. ctx holds the
// call's peer and incoming metadata. It takes the tokens of an allowed
// call. Render the outcome with Status and Metadata.
func (l *Limiter) Decide(ctx context.Context, fullMethod string) *engine.Outcome {
	s := l.fd.Snapshot()
	if !s.Rules.Set.ExactPaths {
		// The rules' path matches are folded (rules.FoldPath): so is the
		// method, so that "/pkg.Service/*" still matches its calls.
		fullMethod = rules.FoldPath(fullMethod)
	}
	v := &callValues{Base: frontdoor.Base{S: s, Lower: true}, method: fullMethod}
	if p, ok := peer.FromContext(ctx); ok && p.Addr != nil {
		v.Peer = p.Addr.String()
	}
	if md, ok := metadata.FromIncomingContext(ctx); ok {
		v.Header = md
	}
	return l.fd.Engine().Decide(ctx, s.Rules, v)
}

// callValues reads a call's values: the peer address, metadata and
// verified claims as every front door does (frontdoor), and the full
// method as its path (folded as the rules' paths are).
type callValues struct {
	frontdoor.Base
	method string
}

func (v *callValues) Value(src rules.Source) (string, bool) {
	switch src.Kind {
	case rules.KindPath:
		return v.method, true
	case rules.KindMethod:
		return http.MethodPost, true
	case rules.KindQuery, rules.KindCookie:
		return "", false
	}
	return v.Base.Value(src)
}

// Metadata returns the response header metadata of a decided call. It
// holds the RateLimit fields in lower case: ratelimit-policy, ratelimit,
// ratelimit-limit, ratelimit-remaining, ratelimit-reset, and retry-after
// on a denial. It is empty when no enforce rule was decided.
func Metadata(out *engine.Outcome) metadata.MD {
	h := http.Header{}
	frontdoor.WriteHeaders(h, out)
	md := make(metadata.MD, len(h))
	for k, v := range h {
		md[strings.ToLower(k)] = v
	}
	return md
}

// Status returns the status of a call: OK when allowed. Over a limit it
// is codes.ResourceExhausted. A failed store under on_error deny, or an
// adaptive rule's denial (OVERLOADED), is codes.Unavailable.
//
// A denial carries a google.rpc.ErrorInfo detail (domain ErrorDomain).
// Its reason is the denial's in upper case, such as
// SLIDING_WINDOW_EXCEEDED. Its metadata names the rule, and the priority
// class of a request shed for it. A google.rpc.RetryInfo detail holds the
// Retry-After delay, if any; a cost over the burst has none. The message
// is the problem details' detail, as the HTTP doors write it.
func Status(out *engine.Outcome) *status.Status {
	if out.Allowed {
		return status.New(codes.OK, "")
	}
	p := frontdoor.ProblemOf(out)
	code := codes.ResourceExhausted
	if out.Reason == engine.ReasonStoreUnavailable || out.Reason == engine.ReasonOverloaded {
		code = codes.Unavailable
	}
	info := &errdetails.ErrorInfo{Reason: strings.ToUpper(p.Reason), Domain: ErrorDomain}
	if p.Rule != "" {
		info.Metadata = map[string]string{"rule": p.Rule}
		if p.Priority != "" {
			info.Metadata["priority"] = p.Priority
		}
	}
	st := status.New(code, p.Detail)
	var err error
	if out.RetryAfter > 0 {
		st, err = st.WithDetails(info, &errdetails.RetryInfo{RetryDelay: durationpb.New(time.Duration(out.RetryAfter) * time.Second)})
	} else {
		st, err = st.WithDetails(info)
	}
	if err != nil { // cannot happen: both details marshal
		return status.New(code, p.Detail)
	}
	return st
}
