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

// Door holds a front door's engine and its rules in force. It is safe
// for concurrent use.
type Door struct {
	eng  *engine.Engine
	snap atomic.Pointer[Snapshot]
}

// New returns a Door that applies set (nil: rules.Default()) with
// state in store, deciding with the engine opts configure
// (engine.Shared: an engine of its own); name prefixes the log messages
// of the engine it builds.
func New(store store.Store, name string, set *rules.Set, opts []engine.Option) *Door {
	eng := engine.New(store, append([]engine.Option{engine.WithName(name), engine.WithLocal(local.New)}, opts...)...)
	l := &Door{eng: eng}
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
	l.snap.Store(&Snapshot{Rules: rs, ReadsPath: rs.Set.ReadsPath(), APIs: apis, jwt: newVerifier(rs.Set.JWT, l.eng.Now)})
}

// Now is the door's clock: its engine's.
func (l *Door) Now() time.Time { return l.eng.Now() }

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
