package redisstore_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/driplimit/drip"
	"github.com/driplimit/drip/store/redisstore"
)

// A per-user and a per-tenant limit taken together, all or nothing. The
// hash tag keeps both keys in one Redis Cluster slot.
func Example_multiTake() {
	store, err := redisstore.Open("redis://127.0.0.1:6379")
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close()
	limiter := drip.New(store, drip.PerSecond(10))
	m, err := limiter.TakeMulti(context.Background(),
		drip.Request{Key: redisstore.Tag("tenant-7", "user:42"), Limit: drip.PerSecond(10), Cost: 1},
		drip.Request{Key: redisstore.Tag("tenant-7", ""), Limit: drip.PerMinute(1000).WithBurst(100), Cost: 1},
	)
	if err != nil {
		log.Fatal(err) // the store failed; being over a limit is not an error
	}
	if !m.Allowed {
		fmt.Printf("429, retry in %v\n", m.RetryAfter.Round(time.Millisecond))
	}
}
