package drip_test

import (
	"context"
	"fmt"
	"time"

	"github.com/driplimit/drip"
	"github.com/driplimit/drip/bucket"
	"github.com/driplimit/drip/store/memstore"
	"github.com/driplimit/drip/storetest"
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
	_, _ = storetest.Apply(context.Background(), store, bucket.Take, at, drip.Request{Key: "tenant:acme", Limit: drip.PerMinute(100), Cost: 100})

	m, _ := limiter.TakeMulti(context.Background(),
		drip.Request{Key: "user:42", Cost: 1},
		drip.Request{Key: "tenant:acme", Limit: drip.PerMinute(100), Cost: 1},
	)
	fmt.Println(m.Allowed, m.Decisions[0].Allowed, m.Decisions[1].Allowed)
	// Output: false true false
}

// Per(n, period) is n tokens per period: 5 every 10 seconds is one every
// 2 seconds. (It is not x/time/rate's Every, which takes the interval
// between two events: Per(1, d) is the limit rate.Every(d) describes.)
func ExamplePer() {
	store := memstore.New()
	defer store.Close()
	at := time.Unix(1_800_000_000, 0)
	limiter := drip.New(store, drip.Per(5, 10*time.Second), drip.WithClock(func() time.Time { return at }))

	d, _ := limiter.TakeN(context.Background(), "user:42", 5) // the whole burst
	fmt.Println(d.Allowed, d.Remaining)
	d, _ = limiter.Take(context.Background(), "user:42")
	fmt.Println(d.Allowed, d.RetryAfter)
	// Output:
	// true 0
	// false 2s
}

// A concurrency limit bounds the requests in flight: here one at a time.
func ExampleLimiter_Acquire() {
	store := memstore.New()
	defer store.Close()
	ctx := context.Background()
	jobs := drip.New(store, drip.InFlight(1, time.Minute))

	first, _ := jobs.Acquire(ctx, "tenant:9")
	second, _ := jobs.Acquire(ctx, "tenant:9") // the slot is held
	fmt.Println(first.Allowed, second.Allowed)
	_ = first.Release(ctx)
	third, _ := jobs.Acquire(ctx, "tenant:9")
	fmt.Println(third.Allowed)
	// Output:
	// true false
	// true
}
