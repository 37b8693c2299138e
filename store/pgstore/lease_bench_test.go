package pgstore_test

import (
	"fmt"
	"testing"

	"github.com/driplimit/drip/storetest"
)

// BenchmarkLeases: acquire+release pairs on one key, 64 clients, beside
// 0 or more leases held (storetest.BenchLeases).
func BenchmarkLeases(b *testing.B) {
	for _, holders := range benchHolders {
		b.Run(fmt.Sprint("holders=", holders), func(b *testing.B) {
			storetest.BenchLeases(b, newStore(b), holders)
		})
	}
}

// benchHolders: the leases held beside the timed pairs (at most
// store.MaxInFlight - 64).
var benchHolders = []int{0, 1000, 100_000}
