package drip

import (
	"context"
	"errors"
	"time"
)

// Separately wraps a store whose multi-takes may refuse keys it cannot apply
// in one atomic step (ErrNotColocated, e.g. Redis Cluster across hash
// slots). Such a multi-take is then applied one request at a time: a take
// takes each request in order and, at the first denial, refunds those
// already taken and peeks at the rest, so that every request still reports
// its own decision. All or nothing then holds in the end rather than at
// every instant (between a take and its refund another caller may see
// fewer tokens), and a failing store in the middle may leave a refund
// undone. Other calls pass straight through.
type Separately struct {
	Store Store
}

var _ Store = Separately{}

// Apply passes through.
func (s Separately) Apply(ctx context.Context, op Op, at time.Time, r Request) (Decision, error) {
	return s.Store.Apply(ctx, op, at, r)
}

// Reset passes through.
func (s Separately) Reset(ctx context.Context, key string) error { return s.Store.Reset(ctx, key) }

// ApplyMulti tries the store's own multi-take first, and falls back to
// applying the requests one by one when it answers ErrNotColocated.
func (s Separately) ApplyMulti(ctx context.Context, op Op, at time.Time, rs []Request) (Multi, error) {
	m, err := s.Store.ApplyMulti(ctx, op, at, rs)
	if !errors.Is(err, ErrNotColocated) {
		return m, err
	}
	if _, err := PrepareMulti(op, rs); err != nil {
		return Multi{}, err
	}
	ds := make([]Decision, len(rs))
	for i, r := range rs {
		d, err := s.Store.Apply(ctx, op, at, r)
		if err != nil {
			if op == OpTake {
				s.refund(ctx, at, rs[:i])
			}
			return Multi{}, err
		}
		ds[i] = d
		if op == OpTake && !d.Allowed {
			s.refund(ctx, at, rs[:i])
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

// refund gives back the tokens of the requests taken before a denial. Their
// decisions stay as taken: a denied multi-take reports what each request
// would have left.
func (s Separately) refund(ctx context.Context, at time.Time, taken []Request) {
	for _, r := range taken {
		if r.Cost == 0 {
			continue
		}
		if _, err := s.Store.Apply(ctx, OpRefund, at, r); err != nil {
			return
		}
	}
}
