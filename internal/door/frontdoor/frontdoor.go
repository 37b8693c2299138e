// Package frontdoor is what the front doors that apply a rules file (the
// net/http middleware, the gRPC interceptors) share, so that they differ
// only in how they read a request and write an answer: the engine and the
// rules in force, swapped whole (Door), and a request's values read the
// same way (Request): the client IP behind trusted proxies, headers (or
// gRPC metadata), and the claims of a verified bearer token, each read at
// most once per request, and the client identity that seeds the
// Retry-After jitter.
package frontdoor

import (
	"sync/atomic"
	"time"

	"github.com/driplimit/drip/engine"
	"github.com/driplimit/drip/internal/door/local"
	"github.com/driplimit/drip/rules"
	"github.com/driplimit/drip/store"
)

// Config is what a front door's options set.
type Config struct {
	// Engine, if set, is the engine to decide with (WithEngine); Eng then
	// goes unused.
	Engine *engine.Engine
	// Eng are the options of the engine New builds otherwise.
	Eng []engine.Option
	// Now is the clock of token expiry; nil for the real clock.
	Now func() time.Time
}

// Door holds a front door's engine and its rules in force. It is safe
// for concurrent use.
type Door struct {
	eng  *engine.Engine
	snap atomic.Pointer[Snapshot]
	now  func() time.Time
}

// New returns a Door that applies set (nil: rules.Default()) with
// state in store; name prefixes the log messages of the engine it builds.
func New(store store.Store, name string, set *rules.Set, c Config) *Door {
	eng := c.Engine
	if eng == nil {
		eng = engine.New(store, append([]engine.Option{engine.WithName(name), engine.WithLocal(local.New)}, c.Eng...)...)
	}
	l := &Door{eng: eng, now: c.Now}
	l.Swap(set)
	return l
}

// Swap makes set the rules of every request from now on.
func (l *Door) Swap(set *rules.Set) {
	rs := l.eng.Compile(set)
	apis := false
	for i := range rs.Set.Rules {
		apis = apis || ruleAPI(&rs.Set.Rules[i]) != ""
	}
	l.snap.Store(&Snapshot{Rules: rs, ReadsPath: rs.Set.ReadsPath(), APIs: apis, jwt: newVerifier(rs.Set.JWT, l.now)})
}

// Now is the door's clock.
func (l *Door) Now() time.Time {
	if l.now == nil {
		return time.Now()
	}
	return l.now()
}

// Snapshot returns the rules in force.
func (l *Door) Snapshot() *Snapshot { return l.snap.Load() }

// Engine returns the engine the limiter decides with.
func (l *Door) Engine() *engine.Engine { return l.eng }

// Snapshot is one rules Set ready for requests: compiled for the engine,
// with its bearer token verifier. It is immutable.
type Snapshot struct {
	Rules *engine.Rules
	// ReadsPath is the rules' ReadsPath: whether a request's path is read.
	ReadsPath bool
	// APIs: a rule reads a model server's API (openai, anthropic): its
	// answers carry that API's headers and errors (llm.go).
	APIs bool
	jwt  *verifier
}

// Option sets a Config: the options of every front door.
type Option func(*Config)

// Configure returns the Config that opts set.
func Configure(opts []Option) Config {
	var c Config
	for _, f := range opts {
		f(&c)
	}
	return c
}

// WithEngine decides with e (Config.Engine).
func WithEngine(e *engine.Engine) Option { return func(c *Config) { c.Engine = e } }

// WithEngineOption adds an option of the engine New builds.
func WithEngineOption(o engine.Option) Option { return func(c *Config) { c.Eng = append(c.Eng, o) } }

// WithClock makes now the time of decisions, token expiry and the
// breaker.
func WithClock(now func() time.Time) Option {
	return func(c *Config) {
		c.Now = now
		c.Eng = append(c.Eng, engine.WithClock(now))
	}
}
