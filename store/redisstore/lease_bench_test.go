package redisstore_test

import (
	"fmt"
	"testing"

	"github.com/driplimit/drip/internal/testkit/testserver"
	"github.com/driplimit/drip/storetest"
)

// BenchmarkLeases: acquire+release pairs on one key, 64 clients, beside
// 0 or more leases held (storetest.BenchLeases).
func BenchmarkLeases(b *testing.B) {
	url := testserver.SharedRedisURL(b)
	for _, holders := range []int{0, 1000, 100_000} {
		b.Run(fmt.Sprint("holders=", holders), func(b *testing.B) {
			storetest.BenchLeases(b, open(b, url), holders)
		})
	}
}
