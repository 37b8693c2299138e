package drip

import (
	"context"
	"sync"
	"time"

	"github.com/driplimit/drip/bucket"
	"github.com/driplimit/drip/store"
)

// Limiter applies one Limit to many keys, with state in a store (a
// memstore, pgstore or redisstore Store). It is safe for concurrent use.
// Construct it with New.
type Limiter struct {
	store store.Store
	limit Limit
	now   func() time.Time // nil: the store's clock
	// params is the limit prepared once, for every key unless keyed: a
	// fixed window without Start places each key's grid by its name.
	params bucket.Params
	keyed  bool
	// admit is the store when it decides plain takes itself (the memory
	// store) and the limit is a token bucket or fixed window the same for
	// every key: Allow's path, with the cost (one token) prepared here.
	admit store.Admitter
	cost  int64
}

// Option configures a Limiter.
type Option func(*Limiter)

// WithClock makes the limiter pass now() as the time of every decision
// instead of using the store's clock.
func WithClock(now func() time.Time) Option { return func(l *Limiter) { l.now = now } }

// New returns a Limiter that holds keys to limit, with state in st.
//
// New panics if limit is invalid (see Limit.Validate), as time.NewTicker
// does for a period that is not positive: a limiter that refused every
// request would fail far from the mistake. Check limits that come from
// configuration with Limit.Validate first.
func New(st store.Store, limit Limit, opts ...Option) *Limiter {
	p, err := limit.Params("")
	if err != nil {
		panic("drip.New: " + err.Error())
	}
	l := &Limiter{store: st, limit: limit, params: p, keyed: limit.keyDependent()}
	for _, o := range opts {
		o(l)
	}
	// Admit decides token buckets and fixed windows only: a sliding
	// window's and a concurrency limit's state is not a bucket.
	if a := st.Caps().Admit; a != nil && !l.keyed && (p.Kind == bucket.Continuous || p.Kind == bucket.Interval || p.Kind == bucket.Window) {
		if c, err := store.Cost(bucket.Take, 1, false, p); err == nil {
			l.admit, l.cost = a, c
		}
	}
	return l
}

// Allow takes one token from key's bucket and reports whether it was
// allowed: Take's decision, for callers that need no more than a yes or
// no. Bad input or a failing store is false (Take reports why). On the
// memory store it builds no Decision (store.Caps.Admit), so it is the
// fastest way to ask.
func (l *Limiter) Allow(key string) bool {
	if l.admit != nil && key != "" && len(key) <= store.MaxKeyLen {
		return l.admit.Admit(key, &l.params, l.cost, l.at())
	}
	d, err := l.Take(context.Background(), key)
	return err == nil && d.Allowed
}

// Limit returns the limiter's limit.
func (l *Limiter) Limit() Limit { return l.limit }

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
	return l.apply(ctx, bucket.Take, key, cost, false, "")
}

// apply makes one decision on the limiter's limit: the request is checked
// and prepared here (store.Prepare), and the store executes it.
func (l *Limiter) apply(ctx context.Context, op bucket.Op, key string, cost float64, reserve bool, lease string) (Decision, error) {
	p, at := &l.params, l.at()
	if l.keyed {
		// The key places the window's grid (and a calendar window's
		// params depend on the time): refuse a bad key before hashing it.
		// The limit itself is valid (New checked it).
		if err := store.CheckKey(key); err != nil {
			return Decision{}, err
		}
		kp, _ := l.limit.paramsAt(key, at)
		p = &kp
	}
	if l.admit != nil && lease == "" && !l.keyed {
		// The memory store: the same decision, without the pooled slices.
		if err := store.CheckKey(key); err != nil {
			return Decision{}, err
		}
		c := l.cost
		if cost != 1 || reserve || op != bucket.Take {
			var err error
			if c, err = store.Cost(op, cost, reserve, *p); err != nil {
				return Decision{}, err
			}
		}
		return DecisionOf(l.admit.ApplyOne(op, key, p, c, reserve, at), p.Burst), nil
	}
	c := calls.Get().(*call)
	it := &c.items[0]
	err := prepareOf(it, op, key, &l.limit, p, cost, reserve, lease)
	if err == nil {
		err = l.store.Apply(ctx, op, at, c.items[:1], c.results[:1])
	}
	if l.keyed {
		calendarHints(&c.results[0], &l.limit, p, at)
	}
	d := DecisionOf(c.results[0], p.Burst)
	it.Key, it.Lease = "", "" // keep no caller's strings alive in the pool
	calls.Put(c)
	if err != nil {
		return Decision{}, err
	}
	return d, nil
}

// call is the item and result of one decision, pooled: a slice handed to
// a store through its interface escapes, and a decision on the memory
// store should allocate nothing.
type call struct {
	items   [pooled]bucket.Prepared
	results [pooled]bucket.Result
}

// pooled is how many items a pooled call holds: a Limiter's one, and the
// few of a front door's rules (drip.Apply).
const pooled = 4

var calls = sync.Pool{New: func() any { return new(call) }}

// Lease is a slot of a concurrency limit acquired by Limiter.Acquire: held
// until Release, or until the limit's LeaseTTL has passed since the
// acquisition, whichever comes first.
type Lease struct {
	// Decision is the acquisition's. Allowed reports whether the slot is
	// held. Burst is MaxInFlight, and Remaining the free slots. A denial's
	// RetryAfter is how long until the earliest lease expires. A holder
	// may release sooner.
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
	id := store.NewLeaseID()
	d, err := l.apply(ctx, bucket.Take, key, 0, false, id)
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
	_, err := le.l.apply(ctx, bucket.Refund, le.Key, 0, false, le.ID)
	return err
}

// Reserve takes cost tokens, going into debt if there are too few (up to
// the limit's MaxReserved). When allowed, the reserved work may run after
// Decision.RetryAfter.
func (l *Limiter) Reserve(ctx context.Context, key string, cost float64) (Decision, error) {
	return l.apply(ctx, bucket.Take, key, cost, true, "")
}

// Peek reports what Take would decide, and changes nothing.
func (l *Limiter) Peek(ctx context.Context, key string) (Decision, error) {
	return l.PeekN(ctx, key, 1)
}

// PeekN reports what TakeN would decide for cost, and changes nothing.
func (l *Limiter) PeekN(ctx context.Context, key string, cost float64) (Decision, error) {
	return l.apply(ctx, bucket.Peek, key, cost, false, "")
}

// Refund gives back cost tokens that were taken for work that did not
// happen. The bucket never holds more than its burst.
func (l *Limiter) Refund(ctx context.Context, key string, cost float64) (Decision, error) {
	return l.apply(ctx, bucket.Refund, key, cost, false, "")
}

// Reset forgets key's bucket: it is full again.
func (l *Limiter) Reset(ctx context.Context, key string) error {
	return l.store.Reset(ctx, key)
}

// TakeMulti takes from several buckets, each with its own limit and cost,
// all or nothing. Requests with a zero Limit use the limiter's.
func (l *Limiter) TakeMulti(ctx context.Context, rs ...Request) (Multi, error) {
	if len(rs) == 0 {
		return Multi{}, store.ErrNoRequests
	}
	own := make([]Request, len(rs))
	for i, r := range rs {
		if r.Limit == (Limit{}) {
			r.Limit = l.limit
		}
		own[i] = r
	}
	return apply(ctx, l.store, bucket.Take, l.at(), true, own)
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
