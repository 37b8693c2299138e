package leased_test

import (
	"context"
	"fmt"
	"time"

	"github.com/driplimit/drip"
	"github.com/driplimit/drip/store/leased"
	"github.com/driplimit/drip/store/memstore"
)

// One limit of a program leased, the others decided by the store as
// they are: the wrapper leases the limits marked Leased (leased.Marked),
// and a drip.Limiter's limit carries its mark. The shared store here is
// the memory store, for the example (LeaseInProcess: a Store passes
// every call to an in-process store as it is otherwise); a deployment
// shares Redis (redisstore.Open) or PostgreSQL between its instances,
// each wrapping it so.
func Example_oneLimit() {
	shared := memstore.New()
	defer shared.Close()
	// The time of every decision, fixed for the example's output.
	now := func() time.Time { return time.Date(2026, 11, 26, 12, 0, 0, 0, time.UTC) }
	st, err := leased.New(shared, leased.LeaseInProcess(), leased.Marked(), leased.WithClock(now))
	if err != nil {
		panic(err) // the store holds no blocks
	}
	defer st.Close() // gives back the tokens its blocks hold

	hot := drip.New(st, drip.PerSecond(1000).WithLeased(true), drip.WithClock(now))
	login := drip.New(st, drip.PerMinute(5), drip.WithClock(now))
	ctx := context.Background()
	granted := 0
	for range 1200 {
		if d, err := hot.Take(ctx, "tenant:1"); err == nil && d.Allowed {
			granted++
		}
	}
	logins := 0
	for range 8 {
		if d, err := login.Take(ctx, "user:7"); err == nil && d.Allowed {
			logins++
		}
	}
	stats := st.Stats()
	fmt.Println("hot: granted at most its burst of 1000:", granted <= 1000)
	fmt.Println("login:", logins, "of 8 granted")
	fmt.Println("leased decisions:", stats.Decisions)
	fmt.Println("most of them without a store call:", stats.Local > stats.Decisions/2)
	// Output:
	// hot: granted at most its burst of 1000: true
	// login: 5 of 8 granted
	// leased decisions: 1200
	// most of them without a store call: true
}
