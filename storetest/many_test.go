package storetest_test

import (
	"testing"

	"github.com/driplimit/drip/store"
	"github.com/driplimit/drip/store/memstore"
	"github.com/driplimit/drip/storetest"
)

// TestManySeeds compares the memory store with the exact model on many
// random traces (the shared suite runs one per store).
func TestManySeeds(t *testing.T) {
	n := 40
	if testing.Short() {
		n = 5
	}
	storetest.RunRandom(t, func(t *testing.T) store.Store {
		s := memstore.New()
		t.Cleanup(func() { s.Close() })
		return s
	}, n, 1000)
}
