// Package drip is a rate limiter for Go: token buckets, fixed windows
// (on a grid, or on the calendar) and sliding windows kept in fixed
// point, and limits on how many requests are in flight at once, with
// state in memory (store/memstore), PostgreSQL (store/pgstore)
// or Redis (store/redisstore), and the same answer from each to the
// millionth of a token.
//
// A user holds keys to a Limit through a Limiter:
//
//	store := memstore.New()
//	lim := drip.New(store, drip.PerSecond(10).WithBurst(20))
//	d, err := lim.Take(ctx, "user:42")
//
// Being over the limit is a Decision (Allowed false, with RetryAfter), never
// an error: errors are bad input (ErrInvalidLimit, ErrCostExceedsBurst,
// and the rest in package store) or a failing store. Take, TakeN, Reserve, Peek, Refund, Reset, TakeMulti (several
// keys, all or nothing) and Wait cover what a caller asks.
//
// PerSecond, PerMinute, PerHour and Per(n, period) make token buckets of n
// tokens per period (Per is not x/time/rate's Every, which takes the
// interval between two events); Window makes one a fixed window.
//
// Windows: Sliding makes a limit a sliding window, at most n tokens in
// any rolling period, counted in slots (WithSlots), never more:
//
//	search := drip.New(store, drip.PerMinute(100).Sliding())
//
// PerDayIn, PerWeekIn and PerMonthIn make calendar windows: n tokens per
// day, ISO week or month in a time zone, each window full again at local
// midnight, daylight saving time included:
//
//	berlin, _ := time.LoadLocation("Europe/Berlin")
//	budget := drip.New(store, drip.PerMonthIn(10000, berlin))
//
// Requests in flight: a concurrency limit, InFlight(n, ttl), bounds how
// many requests run at once rather than how many start per period. Acquire
// takes one of a key's n slots under a lease and Release gives it back; a
// holder that never releases (it crashed) loses its slot ttl after it took
// it:
//
//	jobs := drip.New(store, drip.InFlight(4, time.Minute))
//	lease, err := jobs.Acquire(ctx, "tenant:9")
//	if err == nil && lease.Allowed {
//		defer lease.Release(context.WithoutCancel(ctx))
//		// ... the work ...
//	}
//
// A concurrency limit also travels in a Request (Request.Lease names the
// lease), so TakeMulti takes tokens and slots together, all or nothing.
//
// Time: a Limiter decides on its store's clock (a shared store uses its
// server's, so that instances with skewed clocks agree); WithClock passes
// a time of your own, as tests and replays do. Amounts are kept in
// micro-tokens and times in nanoseconds: no float state drifts.
//
// Zero values: a token bucket or fixed window Limit must have a Rate
// (Period zero is one second, Burst zero is the rate), a concurrency Limit
// a MaxInFlight (LeaseTTL zero is store.DefaultLeaseTTL, 30 s); a Limiter comes from
// New; a Request's zero Cost takes
// nothing (a Limiter's Take costs 1). Limit, Request and Decision are
// values, safe to copy.
//
// Safe for concurrent use: a Limiter and every store are, and a
// multi-key take is one atomic step in the store.
//
// Beyond this package: package store is the kit of store writers (the
// store.Store interface, and wrappers: store.Sharded spreads a hot key
// over several buckets, store.Prefixed puts keys under a prefix), and
// storetest the conformance suite every store passes; httplimit is the
// net/http middleware that applies a rules file (package rules), engine
// is the decision engine behind it and every other front door, and drip
// serve (package server) runs the decision API, a gateway and Envoy's
// rate limit service.
package drip
