package engine

import (
	"time"

	"github.com/driplimit/drip/store"
)

// WithDenials bounds the proofs of denial the engine keeps (store.Denials).
// bytes bounds their memory (0: store.DefaultDenialBytes). stale bounds
// how long each is trusted (0: store.DefaultDenialStale). A decision the
// store's last answer proves denied is then denied without a store call.
// Every engine on a store not in process keeps them, unless
// WithoutDenials. A store already wrapped in store.Denials is used as it
// is.
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
