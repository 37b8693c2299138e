package httplimit

import (
	"context"
	"errors"
	"net/http"

	"github.com/driplimit/drip"
	"github.com/driplimit/drip/engine"
	"github.com/driplimit/drip/internal/door/frontdoor"
	"github.com/driplimit/drip/rules"
	"github.com/driplimit/drip/store"
)

// KeyFunc returns the key of a request's bucket under a KeyLimit: a user
// from the request's context, an API key, a tenant. An empty key with a
// nil error leaves the request unlimited. To limit such requests
// together, return a constant ("anonymous"). An error answers the
// request with KeyLimit.KeyError, and nothing is taken. A panic, here or
// in KeyLimit.Cost, is not recovered, and nothing is taken.
type KeyFunc func(r *http.Request) (key string, err error)

// DefaultKeyName is the name of a KeyLimit that sets none.
const DefaultKeyName = "per-key"

// ReasonKeyError is the reason of a 500: the key function failed.
const ReasonKeyError = frontdoor.ReasonKeyError

// KeyLimit is one limit per key without a rules file: a key function and
// a limit. The engine decides it as one rule called Name. Bucket keys,
// headers, problem body, fail policy, breaker and events are a rule's.
type KeyLimit struct {
	// Name names the limit (default DefaultKeyName) in headers, problem
	// bodies, events and bucket keys ("name|key", as a rule's). Limits
	// and rules that share a store need different names. It has 1 to 128
	// letters, digits, '-', '_' or '.'.
	Name string
	// Limit applies to each key.
	Limit drip.Limit
	// Key computes each request's key. Required.
	Key KeyFunc
	// Cost computes a request's cost (nil: 1). It is called after Key,
	// for requests with a key. A cost that is negative, not finite or
	// above 1e12 counts as 1. A cost above the burst never passes (429
	// cost_exceeds_burst).
	Cost func(r *http.Request) float64
	// OnError decides when the store fails or misses its deadline, as a
	// rule's on_error: rules.Allow (the default), Deny (503) or Local.
	// Local is a memory limiter in each instance, at LocalShare of the
	// rate and burst (default 0.5).
	OnError    rules.OnError
	LocalShare float64
	// KeyError answers a request whose Key failed. When nil, the error is
	// logged, at most once a second. The answer is then a 500 problem+json
	// with reason key_error, without the error's text.
	KeyError func(w http.ResponseWriter, r *http.Request, err error)
}

// KeyLimiter is a KeyLimit's middleware. It is safe for concurrent use.
// Construct it with NewKeyLimiter.
type KeyLimiter struct {
	eng   *engine.Engine
	rules *engine.Rules
	kl    KeyLimit
}

// NewKeyLimiter returns the middleware of kl with state in store. The
// options are engine options, as for New. An invalid KeyLimit is an
// error: no Key, a bad name, limit, fail policy or share, or a burst
// below 1 without Cost.
func NewKeyLimiter(store store.Store, kl KeyLimit, opts ...Option) (*KeyLimiter, error) {
	if kl.Key == nil {
		return nil, errors.New("httplimit: KeyLimit.Key is nil")
	}
	if kl.Name == "" {
		kl.Name = DefaultKeyName
	}
	set, err := rules.FuncRule{Name: kl.Name, Limit: kl.Limit, Cost: kl.Cost != nil, OnError: kl.OnError, LocalShare: kl.LocalShare}.Set()
	if err != nil {
		return nil, errors.New("httplimit: KeyLimit: " + err.Error())
	}
	fd := frontdoor.New(store, "httplimit", set, opts)
	return &KeyLimiter{eng: fd.Engine(), rules: fd.Snapshot().Rules, kl: kl}, nil
}

// Handler returns next behind the limit. A denied request gets its
// status (Status) and never reaches next. A request whose key function
// failed gets KeyError's answer. Every decided request gets the RateLimit
// headers. Its signature is chi's and gorilla/mux's middleware type
// (r.Use(l.Handler)).
func (l *KeyLimiter) Handler(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		out, err := l.decide(r.Context(), r)
		if err != nil {
			l.keyError(w, r, err)
			return
		}
		serve(w, r, next, out, nil) // a key function reads no model server API
	})
}

// Decide decides r without writing a response, for callers that answer
// requests themselves. It takes the tokens of an allowed request. A
// request without a key is allowed, with no rule applied.
//
// When the key function fails, nothing is decided: the outcome is a
// refusal with the reason ReasonKeyError (a 500), and its Err is the
// function's error.
func (l *KeyLimiter) Decide(ctx context.Context, r *http.Request) *engine.Outcome {
	out, err := l.decide(ctx, r)
	if err != nil {
		out = engine.Refuse(ReasonKeyError, keyErrorDetail)
		out.Err = err
	}
	return out
}

// keyErrorDetail is the detail of a key function's failure.
const keyErrorDetail = "the rate limit key of the request could not be computed"

func (l *KeyLimiter) decide(ctx context.Context, r *http.Request) (*engine.Outcome, error) {
	key, err := l.kl.Key(r)
	if err != nil {
		return nil, err
	}
	return l.eng.Decide(ctx, l.rules, &keyValues{r: r, key: key, cost: l.kl.Cost}), nil
}

func (l *KeyLimiter) keyError(w http.ResponseWriter, r *http.Request, err error) {
	if l.kl.KeyError != nil {
		l.kl.KeyError(w, r, err)
		return
	}
	l.eng.LogError("key function failed", err)
	frontdoor.WriteProblem(w, Problem{
		Type:   "about:blank",
		Title:  http.StatusText(http.StatusInternalServerError),
		Status: http.StatusInternalServerError,
		Detail: keyErrorDetail,
		Rule:   l.kl.Name,
		Reason: ReasonKeyError,
	})
}

// Name returns the limit's name.
func (l *KeyLimiter) Name() string { return l.kl.Name }

// Store returns the limiter's store.
func (l *KeyLimiter) Store() store.Store { return l.eng.Store() }

// Engine returns the engine the limiter decides with.
func (l *KeyLimiter) Engine() *engine.Engine { return l.eng }

// BreakerState returns the circuit breaker's state.
func (l *KeyLimiter) BreakerState() string { return l.eng.BreakerState() }

// Close releases the local fallback's memory store, if one was started.
func (l *KeyLimiter) Close() error { return l.eng.Close() }

// keyValues is a request as the engine sees it under a KeyLimit: its key
// is the value of the rule's one limit key (of kind rules.KindFunc).
type keyValues struct {
	r    *http.Request
	key  string
	cost func(*http.Request) float64
}

func (v *keyValues) Value(src rules.Source) (string, bool) {
	if src.Kind == rules.KindFunc {
		return v.key, true
	}
	return "", false
}

// Cost is the cost function's (engine.Values).
func (v *keyValues) Cost(*rules.Rule) (float64, bool) {
	if v.cost == nil {
		return 0, false
	}
	return v.cost(v.r), true
}

// Identity seeds the Retry-After jitter with the bucket key: the key
// function says who the client is.
func (v *keyValues) Identity(key string) string { return "key:" + key }
