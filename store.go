package drip

import (
	"context"
	"time"

	"github.com/driplimit/drip/bucket"
)

// Request is one rate-limited request: which bucket, under which limit, at
// which cost.
type Request struct {
	// Key names the bucket. Required.
	Key string
	// Limit is the limit the bucket is held to.
	Limit Limit
	// Cost is how many tokens the request takes (or refunds). It must be
	// >= 0; zero is valid. Callers that want the customary default of 1 set
	// it (the Limiter does).
	Cost float64
	// Reserve lets a take that finds too few tokens go into debt (up to
	// Limit.MaxReserved): it is allowed, and Decision.RetryAfter says when
	// the reserved work may run.
	Reserve bool
	// Lease is, for a concurrency limit (Algorithm Concurrency), the lease
	// ID a take acquires a slot under, a refund releases, or a peek asks
	// about (a peek without one asks whether a slot is free): 1 to
	// MaxLeaseLen bytes of printable ASCII, NewLeaseID's. Other limits
	// leave it empty. A concurrency take ignores Cost: a lease holds one
	// slot.
	Lease string
}

// Store holds bucket state and makes each decision one atomic step. It is
// the interface store implementers write; users call a Limiter.
//
// A zero at means the store's own clock (a shared store uses its server's,
// so that instances with skewed clocks agree); any other value is the time
// of the decision, which tests and replays supply. Implementations must be
// safe for concurrent use, and must pass storetest.Run.
type Store interface {
	// Apply performs op for one request.
	Apply(ctx context.Context, op Op, at time.Time, r Request) (Decision, error)
	// ApplyMulti performs op for several requests as one atomic step. For
	// OpTake it is all-or-nothing: if any request is denied none is
	// applied. Keys must be distinct (PrepareMulti checks it).
	ApplyMulti(ctx context.Context, op Op, at time.Time, rs []Request) (Multi, error)
	// Reset deletes the bucket of key: it is full again.
	Reset(ctx context.Context, key string) error
}

// InProcess is a Store that decides in the caller's process and never
// waits on a network or a server: the memory store. A deadline guards a
// store call against a server that stalls, and such a store has none, so
// the front doors (package engine) call it without a deadline of its own,
// which saves a timer per call.
type InProcess interface {
	Store
	// InProcess marks the store; it does nothing.
	InProcess()
}

// PreparedStore is a Store that can also apply a request whose limit was
// prepared once: a Limiter whose store has it prepares its limit in New
// and hands the store a pointer to the Params for every decision, instead
// of a Request whose Limit the store would check again each time.
//
// ApplyPrepared must decide exactly as Apply would for a Request with the
// limit p was made from. The caller has checked key (Prepare's rules), made
// p with ParamsOf for a limit that is not KeyDependent, and cost with
// CostOf; p is shared by every call and must not be changed.
type PreparedStore interface {
	Store
	ApplyPrepared(ctx context.Context, op Op, at time.Time, key string, p *bucket.Params, cost int64, reserve bool) (Decision, error)
}
