package memstore_test

import (
	"testing"

	"github.com/driplimit/drip/store"
	"github.com/driplimit/drip/store/memstore"
	"github.com/driplimit/drip/storetest"
)

func TestBlocks(t *testing.T) {
	storetest.RunBlocks(t, func(t *testing.T) store.Store {
		s := memstore.New()
		t.Cleanup(func() { s.Close() })
		return s
	})
}
