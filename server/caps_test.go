package server

import (
	"testing"

	"github.com/driplimit/drip/store"
	"github.com/driplimit/drip/store/memstore"
)

// TestObservedForwardsCaps: the metrics wrapper around the server's store
// keeps the store's capabilities, so that the engine sees a memory store
// as in-process (no deadline timer per call) and the overrides API finds
// the store's overrides, through a prefix too.
func TestObservedForwardsCaps(t *testing.T) {
	ms := memstore.New()
	defer ms.Close()
	for _, st := range []store.Store{ms, store.Prefixed{Store: ms, Prefix: "p:"}} {
		c := newMetrics().observe(st).Caps()
		if !c.InProcess || !c.Leases || c.Overrides == nil {
			t.Errorf("%T: observed caps %+v, want the memory store's", st, c)
		}
	}
}
