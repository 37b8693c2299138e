package drip

import (
	"context"
	"math/rand/v2"
	"strconv"
	"time"
)

// Sharded spreads each key over N sub-buckets, each holding 1/N of the
// limit's rate and burst, for keys too hot for one bucket (one row, one
// Redis key). A take peeks two random shards and takes from the one with
// more tokens (the power of two choices), so load stays even while every
// shard's own limit still holds: the sum over shards never grants more than
// the whole limit would. Fixed windows and interval refills put every shard
// on one grid (see part), so that this holds within each window too.
//
// The price: a request may be denied while another shard still has tokens
// (at most a little, thanks to the two choices), and a cost above burst/N
// can never be granted without reserving. A concurrency limit is not
// spread: its requests pass through under their own key.
type Sharded struct {
	Store Store
	N     int
}

var _ Store = Sharded{}

func (s Sharded) n() int { return max(1, s.N) }

// ShardKey is the key of shard i of key.
func ShardKey(key string, i int) string { return key + "#" + strconv.Itoa(i) }

// part is the limit of each shard of key: 1/N of the rate, burst and debt.
// Windows and interval refills land on one grid for every shard, the
// whole key's, so that the shards refill together: on a grid of its own
// each shard would refill at a different instant, and within one window of
// the whole limit the shards together could grant more than it. An interval
// refill is therefore a fixed window on the key's hashed grid (the grid a
// fixed window of key would have without Start), rather than a grid begun
// by the key's first request, which the shards cannot agree on.
func (s Sharded) part(l Limit, key string) Limit {
	if l.Algorithm == FixedWindow || l.Refill == Interval {
		l.Algorithm, l.Refill = FixedWindow, ""
		l = l.ForKey(key)
	}
	n := float64(s.n())
	l.Burst = l.burst() / n
	l.Rate /= n
	if l.MaxReserved > 0 {
		l.MaxReserved /= n
	}
	return l
}

func (s Sharded) pick(ctx context.Context, at time.Time, r Request) (Request, error) {
	if r.Limit.Algorithm == Concurrency {
		// A release must find the lease its acquire made, so a concurrency
		// limit is never spread: it stays one set of leases under key.
		return r, nil
	}
	n := s.n()
	r.Limit = s.part(r.Limit, r.Key)
	if n == 1 {
		r.Key = ShardKey(r.Key, 0)
		return r, nil
	}
	i := rand.IntN(n)
	j := (i + 1 + rand.IntN(n-1)) % n
	a := Request{Key: ShardKey(r.Key, i), Limit: r.Limit, Cost: r.Cost}
	b := Request{Key: ShardKey(r.Key, j), Limit: r.Limit, Cost: r.Cost}
	m, err := s.Store.ApplyMulti(ctx, OpPeek, at, []Request{a, b})
	if err != nil {
		return r, err
	}
	da, db := m.Decisions[0], m.Decisions[1]
	switch {
	case da.Allowed && db.Allowed && db.Tokens > da.Tokens,
		!da.Allowed && db.Allowed,
		!da.Allowed && !db.Allowed && db.RetryAfter < da.RetryAfter:
		r.Key = b.Key
	default:
		r.Key = a.Key
	}
	return r, nil
}

// Apply takes from (or peeks at, or refunds to) the better of two shards.
func (s Sharded) Apply(ctx context.Context, op Op, at time.Time, r Request) (Decision, error) {
	if r.Key == "" {
		return Decision{}, ErrMissingKey
	}
	p, err := s.pick(ctx, at, r)
	if err != nil {
		return Decision{}, err
	}
	return s.Store.Apply(ctx, op, at, p)
}

// ApplyMulti picks a shard for each request, then applies them together.
func (s Sharded) ApplyMulti(ctx context.Context, op Op, at time.Time, rs []Request) (Multi, error) {
	ps := make([]Request, len(rs))
	for i, r := range rs {
		if r.Key == "" {
			return Multi{}, ErrMissingKey
		}
		p, err := s.pick(ctx, at, r)
		if err != nil {
			return Multi{}, err
		}
		ps[i] = p
	}
	return s.Store.ApplyMulti(ctx, op, at, ps)
}

// Reset resets every shard of key.
func (s Sharded) Reset(ctx context.Context, key string) error {
	for i := range s.n() {
		if err := s.Store.Reset(ctx, ShardKey(key, i)); err != nil {
			return err
		}
	}
	return nil
}
