package drip_test

import (
	"context"
	"fmt"
	"time"

	"github.com/driplimit/drip"
	"github.com/driplimit/drip/store/memstore"
)

func Example() {
	store := memstore.New()
	defer store.Close()
	// 10 requests per second per user, bursts of up to 20.
	limiter := drip.New(store, drip.PerSecond(10).WithBurst(20))

	d, err := limiter.Take(context.Background(), "user:42")
	if err != nil {
		panic(err) // bad input or a failing store; never "over the limit"
	}
	fmt.Println(d.Allowed, d.Remaining)
	// Output: true 19
}

// A request that must be within a per-user and a per-tenant limit takes
// from both or from neither.
func ExampleLimiter_TakeMulti() {
	store := memstore.New()
	defer store.Close()
	at := time.Unix(1_800_000_000, 0)
	limiter := drip.New(store, drip.PerSecond(10), drip.WithClock(func() time.Time { return at }))
	// The tenant has spent its minute's budget.
	_, _ = store.Apply(context.Background(), drip.OpTake, at, drip.Request{Key: "tenant:acme", Limit: drip.PerMinute(100), Cost: 100})

	m, _ := limiter.TakeMulti(context.Background(),
		drip.Request{Key: "user:42", Cost: 1},
		drip.Request{Key: "tenant:acme", Limit: drip.PerMinute(100), Cost: 1},
	)
	fmt.Println(m.Allowed, m.Decisions[0].Allowed, m.Decisions[1].Allowed)
	// Output: false true false
}
