package drip

import (
	"context"
	"errors"
	"time"
)

// Separately wraps a store whose multi-takes may refuse keys it cannot apply
// in one atomic step (ErrNotColocated, e.g. Redis Cluster across hash
// slots). Such a multi-take is then applied one request at a time: a take
// takes each request in order and, at the first denial, gives back those
// already taken (their tokens, and the slots of their leases) and peeks at
// the rest, so that every request still reports its own decision, as the
// store's own multi-take would. All or nothing then holds in the end rather
// than at every instant: between a take and its give-back another caller
// may find fewer tokens or slots. The give-backs run even after ctx has
// ended, under a deadline as long as ctx had left when the call began, so
// that a take failing on the deadline still leaves its predecessors
// undone; only a store failing in the middle may leave one undone (its
// lease then expires after its TTL). A lease the multi-take renewed (held
// already under the same ID) is released by the give-back. Other calls
// pass straight through.
//
// The engine (package engine) calls its store through Separately, so every
// front door falls back to it; engine.WithSeparateTakes sets Always.
type Separately struct {
	Store Store
	// Always applies every multi-key call one request at a time, without
	// trying the store's multi-take first: for a store known to refuse
	// them.
	Always bool
}

var _ Store = Separately{}

// Apply passes through.
func (s Separately) Apply(ctx context.Context, op Op, at time.Time, r Request) (Decision, error) {
	return s.Store.Apply(ctx, op, at, r)
}

// Reset passes through.
func (s Separately) Reset(ctx context.Context, key string) error { return s.Store.Reset(ctx, key) }

// ApplyMulti tries the store's own multi-take first (unless Always), and
// falls back to applying the requests one by one when it answers
// ErrNotColocated.
func (s Separately) ApplyMulti(ctx context.Context, op Op, at time.Time, rs []Request) (Multi, error) {
	if !s.Always {
		m, err := s.Store.ApplyMulti(ctx, op, at, rs)
		if !errors.Is(err, ErrNotColocated) {
			return m, err
		}
	}
	if _, err := PrepareMulti(op, rs); err != nil {
		return Multi{}, err
	}
	undo := undoContext(ctx)
	ds := make([]Decision, len(rs))
	for i, r := range rs {
		d, err := s.Store.Apply(ctx, op, at, r)
		if err != nil {
			if op == OpTake {
				s.giveBack(undo, at, rs[:i])
			}
			return Multi{}, err
		}
		ds[i] = d
		if op == OpTake && !d.Allowed {
			s.giveBack(undo, at, rs[:i])
			for j := i + 1; j < len(rs); j++ {
				if ds[j], err = s.Store.Apply(ctx, OpPeek, at, rs[j]); err != nil {
					return Multi{}, err
				}
			}
			return Combine(ds), nil
		}
	}
	return Combine(ds), nil
}

// undoContext returns the context of the give-backs of a multi-take on
// ctx: ctx's values without its cancellation, under a deadline as long as
// ctx has left now (none if ctx has none).
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

// giveBack refunds the requests taken before a denial or a failure: their
// tokens, and the slots of their leases. Their decisions stay as taken: a
// denied multi-take reports what each request would have left.
func (s Separately) giveBack(undo func() (context.Context, context.CancelFunc), at time.Time, taken []Request) {
	if len(taken) == 0 {
		return
	}
	ctx, cancel := undo()
	defer cancel()
	for _, r := range taken {
		if r.Cost == 0 && r.Lease == "" {
			continue // took nothing
		}
		if _, err := s.Store.Apply(ctx, OpRefund, at, r); err != nil {
			return
		}
	}
}
