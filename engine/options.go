package engine

import (
	"log/slog"
	"time"

	"github.com/driplimit/drip/store"
)

// Option configures an Engine. The front doors (httplimit, grpclimit)
// take these options too.
type Option func(*Engine)

// Shared makes New return e itself and ignore its other options. A front
// door built with it decides with e: one store, breaker, observer and
// deadline for several doors.
func Shared(e *Engine) Option { return func(x *Engine) { x.shared = e } }

// WithLogger sets the logger for store failures and breaker changes
// (default slog.Default()).
func WithLogger(log *slog.Logger) Option { return func(e *Engine) { e.log = log } }

// WithObserver sets the observer of decisions, store calls and the
// breaker.
func WithObserver(o Observer) Option { return func(e *Engine) { e.obs = o } }

// WithKeys sets the observer of the keys behind each decision (nil:
// none). Front doors that report decisions themselves (Envoy's service,
// the decision API) tell it too, through Engine.Keys.
func WithKeys(k KeyObserver) Option { return func(e *Engine) { e.keys = k } }

// WithTimeout sets the deadline of each store call (default
// DefaultTimeout). A rules file's store_timeout takes precedence.
func WithTimeout(d time.Duration) Option { return func(e *Engine) { e.timeout = d } }

// WithSeparateTakes is for stores that cannot take several keys in one
// atomic step, such as Redis Cluster. Every multi-key call is applied one
// request at a time, in file order (store.Separately). When a take is
// denied, those already taken are given back and the rest are peeked.
// Without the option, a store that answers store.ErrNotColocated gets
// the same, after a first attempt. The answers are those of one atomic
// multi-take; all or nothing holds in the end, not at every instant.
func WithSeparateTakes() Option { return func(e *Engine) { e.separate = true } }

// WithClock makes the engine pass now() as the time of each decision
// (instead of the store's clock), and use it for the circuit breaker.
func WithClock(now func() time.Time) Option { return func(e *Engine) { e.now = now } }

// WithLocal hands the engine the store of on_error "local". newStore is
// called once, when a rule first falls back to it. Close closes that
// store if it has a Close method. It should live in this process and be
// bounded in memory; drip's doors pass a memory store of at most 65536
// keys.
// Without it, on_error local allows, as on_error allow does.
func WithLocal(newStore func() store.Store) Option {
	return func(e *Engine) { e.newLocal = newStore }
}

// WithName sets the prefix of the engine's log messages (default
// "drip").
func WithName(name string) Option { return func(e *Engine) { e.name = name } }
