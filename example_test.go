package drip_test

import (
	"context"
	"errors"
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

// A sliding window: never more than 3 in any rolling minute. Its slots
// are 6 seconds long (a minute in 10), and a take stays counted until
// its slot has left the window: 66 seconds here, the price of counting
// by slot (docs/semantics.md).
func ExampleLimit_Sliding() {
	store := memstore.New()
	defer store.Close()
	at := time.Unix(1_800_000_000, 0) // on a slot boundary
	limiter := drip.New(store, drip.PerMinute(3).Sliding(), drip.WithClock(func() time.Time { return at }))

	d, _ := limiter.TakeN(context.Background(), "user:42", 3)
	fmt.Println(d.Allowed, d.Remaining)
	d, _ = limiter.Take(context.Background(), "user:42")
	fmt.Println(d.Allowed, d.RetryAfter)
	at = at.Add(d.RetryAfter)
	d, _ = limiter.Take(context.Background(), "user:42")
	fmt.Println(d.Allowed)
	// Output:
	// true 0
	// false 1m6s
	// true
}

// A calendar month in Berlin: the budget comes back on the 1st at local
// midnight, whatever the month's length.
func ExamplePerMonthIn() {
	berlin, err := time.LoadLocation("Europe/Berlin")
	if err != nil {
		panic(err)
	}
	store := memstore.New()
	defer store.Close()
	at := time.Date(2026, time.January, 31, 23, 30, 0, 0, berlin)
	limiter := drip.New(store, drip.PerMonthIn(1000, berlin), drip.WithClock(func() time.Time { return at }))

	d, _ := limiter.TakeN(context.Background(), "tenant:acme", 1000)
	fmt.Println(d.Allowed, d.Remaining)
	d, _ = limiter.Take(context.Background(), "tenant:acme")
	fmt.Println(d.Allowed, d.RetryAfter)
	// Output:
	// true 0
	// false 30m0s
}

// Allow is the yes or no of a take, for a hot path that needs no details.
func ExampleLimiter_Allow() {
	store := memstore.New()
	defer store.Close()
	at := time.Unix(1_800_000_000, 0)
	limiter := drip.New(store, drip.PerSecond(2), drip.WithClock(func() time.Time { return at }))

	fmt.Println(limiter.Allow("user:42"), limiter.Allow("user:42"), limiter.Allow("user:42"))
	// Output: true true false
}

// Reserve takes now for work that runs later: past the bucket, into debt
// up to MaxReserved, with RetryAfter saying when the work may start.
func ExampleLimiter_Reserve() {
	store := memstore.New()
	defer store.Close()
	at := time.Unix(1_800_000_000, 0)
	exports := drip.New(store, drip.PerMinute(10).WithMaxReserved(50), drip.WithClock(func() time.Time { return at }))

	d, _ := exports.Reserve(context.Background(), "tenant:acme", 30) // 10 in the bucket, 20 of debt
	fmt.Println(d.Allowed, d.Tokens, d.RetryAfter)
	d, _ = exports.Reserve(context.Background(), "tenant:acme", 40) // 60 of debt: over the bound
	fmt.Println(d.Allowed)
	// Output:
	// true -20 2m0s
	// false
}

// Wait reserves and sleeps until the tokens are due; when the context's
// deadline comes first, it gives them back at once and says so.
func ExampleLimiter_Wait() {
	store := memstore.New()
	defer store.Close()
	at := time.Unix(1_800_000_000, 0)
	limiter := drip.New(store, drip.PerHour(1), drip.WithClock(func() time.Time { return at }))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	fmt.Println(limiter.Wait(ctx, "user:42")) // the token is there
	err := limiter.Wait(ctx, "user:42")       // the next one is an hour away
	fmt.Println(errors.Is(err, context.DeadlineExceeded), errors.Is(err, drip.ErrWouldExceedDeadline))
	d, _ := limiter.Peek(ctx, "user:42")
	fmt.Println(d.Tokens) // nothing taken by the wait that gave up
	// Output:
	// <nil>
	// true true
	// 0
}
