package frontdoor

import (
	"github.com/driplimit/drip/store"
	"github.com/driplimit/drip/store/memstore"
)

// LocalMaxKeys bounds the memory of the local fallback (on_error local)
// of each engine a front door builds.
const LocalMaxKeys = 1 << 16

// Local returns the store of an engine's local fallback
// (engine.WithLocal): a memory store of at most LocalMaxKeys buckets.
func Local() store.Store { return memstore.New(memstore.WithMaxKeys(LocalMaxKeys)) }
