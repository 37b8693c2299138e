package store

import (
	"context"
	"errors"
	"time"

	"github.com/driplimit/drip/bucket"
)

// Separately wraps a store that may refuse keys it cannot apply in one
// atomic step (ErrNotColocated, Caps.SplitsKeys), such as Redis Cluster
// across hash slots. Such a call is then applied one item at a time. A
// take takes each item in order. At the first denial it gives back those
// already taken, tokens and slots, and peeks at the rest. Every item
// still reports its own result.
//
// All or nothing then holds in the end, not at every instant: between a
// take and its give-back, another caller may find fewer tokens. The
// give-backs run even after ctx has ended, under a deadline as long as
// ctx had left at the start. Only a store failing in the middle may leave
// a take in place; its lease then expires after its TTL. A lease the call
// renewed is released by the give-back. Calls of one item pass straight
// through.
type Separately struct {
	Store Store
	// Always applies every call of several items one item at a time,
	// without trying the store's own call first: for a store known to
	// refuse them.
	Always bool
}

var _ Store = Separately{}

// Reset passes through.
func (s Separately) Reset(ctx context.Context, key string) error { return s.Store.Reset(ctx, key) }

// Caps are the store's.
func (s Separately) Caps() Caps { return s.Store.Caps() }

// Apply tries the store's own call first (unless Always, or for one
// item), and falls back to applying the items one by one when it answers
// ErrNotColocated.
func (s Separately) Apply(ctx context.Context, op bucket.Op, at time.Time, items []bucket.Prepared, results []bucket.Result) error {
	if len(items) <= 1 || !s.Always {
		err := s.Store.Apply(ctx, op, at, items, results)
		if len(items) <= 1 || !errors.Is(err, ErrNotColocated) {
			return err
		}
	}
	undo := undoContext(ctx)
	for i := range items {
		if err := s.Store.Apply(ctx, op, at, items[i:i+1], results[i:i+1]); err != nil {
			if op == bucket.Take {
				s.giveBack(undo, at, items[:i])
			}
			return err
		}
		if op == bucket.Take && !results[i].Allowed {
			s.giveBack(undo, at, items[:i])
			for j := i + 1; j < len(items); j++ {
				if err := s.Store.Apply(ctx, bucket.Peek, at, items[j:j+1], results[j:j+1]); err != nil {
					return err
				}
			}
			return nil
		}
	}
	return nil
}

// undoContext returns the context of the give-backs of a call on ctx:
// ctx's values without its cancellation, under a deadline as long as ctx
// has left now (none if ctx has none).
func undoContext(ctx context.Context) func() (context.Context, context.CancelFunc) {
	dl, ok := ctx.Deadline()
	left := time.Until(dl)
	return func() (context.Context, context.CancelFunc) {
		c := context.WithoutCancel(ctx)
		if !ok {
			return c, func() {}
		}
		return context.WithTimeout(c, left)
	}
}

// giveBack refunds the items taken before a denial or a failure: their
// tokens, and the slots of their leases. Their results stay as taken: a
// denied call reports what each item would have left.
func (s Separately) giveBack(undo func() (context.Context, context.CancelFunc), at time.Time, taken []bucket.Prepared) {
	if len(taken) == 0 {
		return
	}
	ctx, cancel := undo()
	defer cancel()
	var r [1]bucket.Result
	for i := range taken {
		if taken[i].Cost == 0 && taken[i].Lease == "" {
			continue // took nothing
		}
		if err := s.Store.Apply(ctx, bucket.Refund, at, taken[i:i+1], r[:]); err != nil {
			return
		}
	}
}
