package store

import (
	"context"
	"math/rand/v2"
	"time"

	"github.com/driplimit/drip/bucket"
)

// Sharded spreads each key over N sub-buckets, for keys too hot for one
// bucket. Each holds 1/N of the limit's rate and burst. A take peeks two
// random shards and takes from the one with more tokens (the power of two
// choices). Load stays even, and the shards together never grant more
// than the whole limit. Fixed windows and interval refills put every
// shard on one grid, so this holds within each window too.
//
// The price: a request may be denied while another shard has tokens
// left, though little, thanks to the two choices. A cost above burst/N is
// refused (ErrCostExceedsBurst). A concurrency limit is not spread.
type Sharded struct {
	Store Store
	N     int
}

var _ Store = Sharded{}

func (s Sharded) n() int { return max(1, s.N) }

// unbounded is the MaxReserved of a limit without a bound on reservations
// (drip.Limit.Params gives it MaxAmount): it is not divided among shards.
const unbounded = MaxAmount * bucket.Micro

// part is the params of each shard of key: 1/N of the rate, burst and
// debt, rounded to the nearest micro-token. Windows and interval refills
// land on one grid for every shard, the whole key's, so that the shards
// refill together: on a grid of its own each shard would refill at a
// different instant, and within one window of the whole limit the shards
// together could grant more than it. An interval refill is therefore a
// fixed window on the key's hashed grid (the grid a fixed window of key
// has without Start), rather than a grid begun by the key's first request,
// which the shards cannot agree on.
func (s Sharded) part(p bucket.Params, key string) bucket.Params {
	if p.Kind == bucket.Interval {
		p.Kind = bucket.Window
		p.Start = int64(WindowStart(key, time.Duration(p.Period)))
	}
	n := int64(s.n())
	div := func(x int64) int64 { return (2*x + n) / (2 * n) }
	p.Burst = div(p.Burst)
	p.Rate = div(p.Rate)
	if p.MaxReserved > 0 && p.MaxReserved != unbounded {
		p.MaxReserved = div(p.MaxReserved)
	}
	return p
}

// pick is it on its shard: the better of two, after a peek at both.
func (s Sharded) pick(ctx context.Context, op bucket.Op, at time.Time, it bucket.Prepared) (bucket.Prepared, error) {
	if it.Key == "" {
		return it, ErrMissingKey
	}
	if it.Params.Kind == bucket.Concurrency {
		// A release must find the lease its acquire made, so a concurrency
		// limit is never spread: it stays one set of leases under key.
		return it, nil
	}
	n := s.n()
	it.Params = s.part(it.Params, it.Key)
	cost := float64(it.Cost) / bucket.Micro
	if n == 1 {
		it.Key = ShardKey(it.Key, 0)
		if err := CheckKey(it.Key); err != nil {
			return it, err // MaxKeyLen counts the suffix
		}
		return it, checkBurst(op, it.Cost, cost, it.Reserve, it.Params)
	}
	i := rand.IntN(n)
	j := (i + 1 + rand.IntN(n-1)) % n
	a := bucket.Prepared{Key: ShardKey(it.Key, i), Params: it.Params, Cost: it.Cost}
	b := bucket.Prepared{Key: ShardKey(it.Key, j), Params: it.Params, Cost: it.Cost}
	for _, k := range []string{a.Key, b.Key} {
		if err := CheckKey(k); err != nil {
			return it, err // MaxKeyLen counts the suffix
		}
	}
	// The peek holds the cost to a shard's burst, whatever the op.
	if err := checkBurst(bucket.Peek, it.Cost, cost, false, it.Params); err != nil {
		return it, err
	}
	var res [2]bucket.Result
	if err := s.Store.Apply(ctx, bucket.Peek, at, []bucket.Prepared{a, b}, res[:]); err != nil {
		return it, err
	}
	da, db := res[0], res[1]
	switch {
	case da.Allowed && db.Allowed && db.Tokens > da.Tokens,
		!da.Allowed && db.Allowed,
		!da.Allowed && !db.Allowed && db.RetryAfter < da.RetryAfter:
		it.Key = b.Key
	default:
		it.Key = a.Key
	}
	return it, checkBurst(op, it.Cost, cost, it.Reserve, it.Params)
}

// Apply picks a shard for each item, the better of two, then applies
// them together; items is not modified.
func (s Sharded) Apply(ctx context.Context, op bucket.Op, at time.Time, items []bucket.Prepared, results []bucket.Result) error {
	own := make([]bucket.Prepared, len(items))
	for i, it := range items {
		p, err := s.pick(ctx, op, at, it)
		if err != nil {
			return err
		}
		own[i] = p
	}
	return s.Store.Apply(ctx, op, at, own, results)
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

// Caps are the store's, without its fast path, which would miss the
// shard suffix.
func (s Sharded) Caps() Caps {
	c := s.Store.Caps()
	c.Admit = nil
	return c
}
