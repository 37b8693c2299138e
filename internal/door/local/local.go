// Package local is the store of the engine's local fallback (on_error
// local) for every front door: the HTTP ones and Envoy's alike.
package local

import (
	"github.com/driplimit/drip/store"
	"github.com/driplimit/drip/store/memstore"
)

// MaxKeys bounds the memory of the local fallback of each engine a front
// door builds.
const MaxKeys = 1 << 16

// New returns the store of an engine's local fallback (engine.WithLocal):
// a memory store of at most MaxKeys buckets.
func New() store.Store { return memstore.New(memstore.WithMaxKeys(MaxKeys)) }
