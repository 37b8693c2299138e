package drip

import (
	"context"
	"time"

	"github.com/driplimit/drip/bucket"
)

// Limiter applies one Limit to many keys, with state in a Store. It is safe
// for concurrent use. Construct it with New.
type Limiter struct {
	store Store
	limit Limit
	now   func() time.Time // nil: the store's clock
	// fast is the store's PreparedStore side when it has one and the limit
	// does not depend on the key; params is the limit prepared once, which
	// it is handed by pointer.
	fast   PreparedStore
	params bucket.Params
}

// Option configures a Limiter.
type Option func(*Limiter)

// WithClock makes the limiter pass now() as the time of every decision
// instead of using the store's clock.
func WithClock(now func() time.Time) Option { return func(l *Limiter) { l.now = now } }

// New returns a Limiter that holds keys to limit, with state in store.
//
// New panics if limit is invalid (see Limit.Validate), as time.NewTicker
// does for a period that is not positive: a limiter that refused every
// request would fail far from the mistake. Check limits that come from
// configuration with Limit.Validate first.
func New(store Store, limit Limit, opts ...Option) *Limiter {
	p, err := ParamsOf(limit, "")
	if err != nil {
		panic("drip.New: " + err.Error())
	}
	l := &Limiter{store: store, limit: limit, params: p}
	if ps, ok := store.(PreparedStore); ok && !limit.KeyDependent() && !limit.Concurrent() {
		l.fast = ps
	}
	for _, o := range opts {
		o(l)
	}
	return l
}

// Limit returns the limiter's limit.
func (l *Limiter) Limit() Limit { return l.limit }

// Store returns the limiter's store.
func (l *Limiter) Store() Store { return l.store }

func (l *Limiter) at() time.Time {
	if l.now == nil {
		return time.Time{}
	}
	return l.now()
}

// Take takes one token from key's bucket.
func (l *Limiter) Take(ctx context.Context, key string) (Decision, error) {
	return l.TakeN(ctx, key, 1)
}

// TakeN takes cost tokens from key's bucket. A denial is a Decision with
// Allowed false; an error means bad input or a failing store.
func (l *Limiter) TakeN(ctx context.Context, key string, cost float64) (Decision, error) {
	return l.apply(ctx, OpTake, key, cost, false)
}

// apply makes one decision on the limiter's limit: through the store's
// PreparedStore side when it has one, which skips re-checking the limit
// for every request, else through Store.Apply. Both check the key and the
// cost the same way (Prepare).
func (l *Limiter) apply(ctx context.Context, op Op, key string, cost float64, reserve bool) (Decision, error) {
	if l.fast == nil {
		return l.store.Apply(ctx, op, l.at(), Request{Key: key, Limit: l.limit, Cost: cost, Reserve: reserve})
	}
	if err := CheckKey(key); err != nil {
		return Decision{}, err
	}
	c, err := CostOf(op, cost, reserve, l.params)
	if err != nil {
		return Decision{}, err
	}
	return l.fast.ApplyPrepared(ctx, op, l.at(), key, &l.params, c, reserve)
}

// Lease is a slot of a concurrency limit acquired by Limiter.Acquire: held
// until Release, or until the limit's LeaseTTL has passed since the
// acquisition, whichever comes first.
type Lease struct {
	// Decision is the acquisition's: Allowed reports whether the slot is
	// held; Burst is MaxInFlight and Remaining the free slots; a denial's
	// RetryAfter is how long until the earliest lease held expires (an
	// upper bound: a holder may release sooner).
	Decision
	// Key and ID name the lease in the store.
	Key, ID string

	l *Limiter
}

// Acquire takes one of key's slots under a concurrency limit (see
// InFlight), under a fresh random lease ID. When Lease.Allowed is false
// every slot is held and nothing was taken. Release the lease when the
// work ends; a holder that never does (it crashed) loses it after the
// limit's LeaseTTL.
func (l *Limiter) Acquire(ctx context.Context, key string) (Lease, error) {
	id := NewLeaseID()
	d, err := l.store.Apply(ctx, OpTake, l.at(), Request{Key: key, Limit: l.limit, Lease: id})
	if err != nil {
		return Lease{}, err
	}
	return Lease{Decision: d, Key: key, ID: id, l: l}, nil
}

// Release gives the lease's slot back. Releasing a lease that was denied,
// released already, or expired does nothing and is no error. It uses ctx
// as it is: a caller whose context has ended (a cancelled request) should
// release with a fresh one (context.WithoutCancel and a timeout).
func (le Lease) Release(ctx context.Context) error {
	if !le.Allowed || le.l == nil {
		return nil
	}
	_, err := le.l.store.Apply(ctx, OpRefund, le.l.at(), Request{Key: le.Key, Limit: le.l.limit, Lease: le.ID})
	return err
}

// Reserve takes cost tokens, going into debt if there are too few (up to
// the limit's MaxReserved). When allowed, the reserved work may run after
// Decision.RetryAfter.
func (l *Limiter) Reserve(ctx context.Context, key string, cost float64) (Decision, error) {
	return l.apply(ctx, OpTake, key, cost, true)
}

// Peek reports what Take would decide, and changes nothing.
func (l *Limiter) Peek(ctx context.Context, key string) (Decision, error) {
	return l.PeekN(ctx, key, 1)
}

// PeekN reports what TakeN would decide for cost, and changes nothing.
func (l *Limiter) PeekN(ctx context.Context, key string, cost float64) (Decision, error) {
	return l.apply(ctx, OpPeek, key, cost, false)
}

// Refund gives back cost tokens that were taken for work that did not
// happen. The bucket never holds more than its burst.
func (l *Limiter) Refund(ctx context.Context, key string, cost float64) (Decision, error) {
	return l.apply(ctx, OpRefund, key, cost, false)
}

// Reset forgets key's bucket: it is full again.
func (l *Limiter) Reset(ctx context.Context, key string) error {
	return l.store.Reset(ctx, key)
}

// TakeMulti takes from several buckets, each with its own limit and cost,
// all or nothing. Requests with a zero Limit use the limiter's.
func (l *Limiter) TakeMulti(ctx context.Context, rs ...Request) (Multi, error) {
	if len(rs) == 0 {
		return Multi{}, ErrNoRequests
	}
	own := make([]Request, len(rs))
	for i, r := range rs {
		if r.Limit == (Limit{}) {
			r.Limit = l.limit
		}
		own[i] = r
	}
	return l.store.ApplyMulti(ctx, OpTake, l.at(), own)
}

// Wait blocks until one token of key's bucket is granted, or ctx ends.
func (l *Limiter) Wait(ctx context.Context, key string) error {
	return l.WaitN(ctx, key, 1)
}

// ErrWouldExceedDeadline is returned by Wait when the context's deadline
// comes before the tokens would be granted; nothing is taken. It matches
// context.DeadlineExceeded too (errors.Is), so callers that handle a
// deadline one way handle both.
var ErrWouldExceedDeadline error = wouldExceedDeadline{}

type wouldExceedDeadline struct{}

func (wouldExceedDeadline) Error() string { return "drip: wait would exceed context deadline" }

// Is makes the error match context.DeadlineExceeded.
func (wouldExceedDeadline) Is(target error) bool { return target == context.DeadlineExceeded }

// Timeout reports true, as context.DeadlineExceeded does.
func (wouldExceedDeadline) Timeout() bool { return true }

// WaitN blocks until cost tokens of key's bucket are granted, or ctx ends.
// It reserves the tokens in one store call and sleeps until the reservation
// is due, so waiters are served in order. If the context's deadline comes
// first, the reservation is refunded and ErrWouldExceedDeadline returned.
func (l *Limiter) WaitN(ctx context.Context, key string, cost float64) error {
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		d, err := l.Reserve(ctx, key, cost)
		if err != nil {
			return err
		}
		if d.Allowed && d.RetryAfter == 0 {
			return nil
		}
		if dl, ok := ctx.Deadline(); ok && time.Until(dl) < d.RetryAfter {
			if d.Allowed {
				// Give the reservation back; the context's end is near, so
				// use a fresh one for the refund.
				rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
				_, _ = l.Refund(rctx, key, cost)
				cancel()
			}
			return ErrWouldExceedDeadline
		}
		t := time.NewTimer(d.RetryAfter)
		select {
		case <-t.C:
			if d.Allowed {
				return nil
			}
		case <-ctx.Done():
			t.Stop()
			if d.Allowed {
				rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
				_, _ = l.Refund(rctx, key, cost)
				cancel()
			}
			return ctx.Err()
		}
	}
}
