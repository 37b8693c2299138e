// Package drip is a rate limiter for Go. It keeps token buckets, fixed
// windows (on a grid, or on the calendar), sliding windows and limits on
// requests in flight. State lives in memory (store/memstore), PostgreSQL
// (store/pgstore) or Redis (store/redisstore). Each store gives the same
// answer, to the millionth of a token.
//
// A user holds keys to a Limit through a Limiter:
//
//	store := memstore.New()
//	lim := drip.New(store, drip.PerSecond(10).WithBurst(20))
//	d, err := lim.Take(ctx, "user:42")
//
// Being over the limit is a Decision (Allowed false, with RetryAfter),
// never an error. Errors are bad input (ErrInvalidLimit,
// ErrCostExceedsBurst, and the rest in package store) or a failing store.
// Take, TakeN, Reserve, Peek, Refund, Reset, TakeMulti and Wait cover what
// a caller asks. TakeMulti takes several keys, all or nothing.
//
// PerSecond, PerMinute, PerHour and Per(n, period) make token buckets of
// n tokens per period. Per is not x/time/rate's Every, which takes the
// interval between two events. Window makes a limit a fixed window.
//
// Windows: Sliding makes a limit a sliding window: at most n tokens in
// any rolling period, counted in slots (WithSlots).
//
//	search := drip.New(store, drip.PerMinute(100).Sliding())
//
// PerDayIn, PerWeekIn and PerMonthIn make calendar windows: n tokens per
// day, ISO week or month in a time zone. Each window is full again at
// local midnight, daylight saving time included:
//
//	berlin, _ := time.LoadLocation("Europe/Berlin")
//	budget := drip.New(store, drip.PerMonthIn(10000, berlin))
//
// Requests in flight: a concurrency limit, InFlight(n, ttl), bounds how
// many requests run at once. Acquire takes one of a key's n slots under a
// lease, and Release gives it back. A holder that never releases (it
// crashed) loses its slot ttl after it took it:
//
//	jobs := drip.New(store, drip.InFlight(4, time.Minute))
//	lease, err := jobs.Acquire(ctx, "tenant:9")
//	if err == nil && lease.Allowed {
//		defer lease.Release(context.WithoutCancel(ctx))
//		// ... the work ...
//	}
//
// A concurrency limit also travels in a Request (Request.Lease names the
// lease). TakeMulti then takes tokens and slots together, all or nothing.
//
// Time: a Limiter decides on its store's clock. A shared store uses its
// server's, so instances with skewed clocks agree. WithClock passes a time
// of your own, as tests and replays do. Amounts are kept in micro-tokens
// and times in nanoseconds, so no float state drifts.
//
// Zero values: a rate Limit must have a Rate (Period zero is one second,
// Burst zero is the rate). A concurrency Limit must have a MaxInFlight
// (LeaseTTL zero is store.DefaultLeaseTTL, 30 s). A Limiter comes from
// New. A Request's zero Cost takes nothing; a Limiter's Take costs 1.
// Limit, Request and Decision are values, safe to copy.
//
// Safe for concurrent use: a Limiter and every store are. A multi-key
// take is one atomic step in the store.
//
// Beyond this package: package store is the kit of store writers (the
// store.Store interface and its wrappers). storetest is the conformance
// suite every store passes. httplimit is the net/http middleware that
// applies a rules file (package rules). engine is the decision engine
// behind every front door. drip serve (package server) runs the decision
// API, a gateway and Envoy's rate limit service.
package drip
