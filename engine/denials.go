package engine

import (
	"time"

	"github.com/driplimit/drip/store"
)

// WithDenials sets the bound of the proofs of denial the engine keeps
// (store.Denials: bytes; 0 store.DefaultDenialBytes) and how long each is
// trusted at most (0: store.DefaultDenialStale). Every engine on a store
// that does not decide in process keeps them (a decision the store's
// last answer proves denied is denied without a store call), unless
// WithoutDenials; a store already wrapped in store.Denials (drip serve's,
// whose admin resets clear its proofs) is used as it is.
func WithDenials(bytes int64, stale time.Duration) Option {
	return func(e *Engine) { e.denials = store.DenialsOptions{Bytes: bytes, Stale: stale} }
}

// WithoutDenials makes the engine ask the store every decision, even one
// its last answer proved denied.
func WithoutDenials() Option { return func(e *Engine) { e.noDenials = true } }

// withDenials is st wrapped in store.Denials when it gains from it.
func (e *Engine) withDenials(st store.Store) store.Store {
	if e.noDenials || e.inproc {
		return st
	}
	e.deny = store.NewDenials(st, e.denials)
	return e.deny
}
