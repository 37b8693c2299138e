package drip

import (
	"context"
	"fmt"
	"math"
	"sync/atomic"
	"time"

	"github.com/driplimit/drip/bucket"
	"github.com/driplimit/drip/store"
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
	// Lease is a concurrency limit's lease ID: a take acquires a slot
	// under it, a refund releases it, a peek asks about it. A peek without
	// one asks whether a slot is free. It has 1 to store.MaxLeaseLen bytes
	// of printable ASCII (store.NewLeaseID). Other limits leave it empty.
	// A concurrency take ignores Cost: a lease holds one slot.
	Lease string
}

// prepare checks r for op and resolves it to fixed point: the key, then
// the limit, the cost and the lease, in that order, so that every caller
// reports the first problem the same way.
func prepare(op bucket.Op, r *Request, at time.Time) (bucket.Prepared, error) {
	if err := store.CheckKey(r.Key); err != nil {
		return bucket.Prepared{}, err
	}
	p, err := paramsFor(&r.Limit, r.Key, at)
	if err != nil {
		return bucket.Prepared{}, err
	}
	var it bucket.Prepared
	err = prepareOf(&it, op, r.Key, &r.Limit, &p, r.Cost, r.Reserve, r.Lease)
	return it, err
}

// prepareOf is store.Prepare of a request of limit l (p in fixed point),
// marked leased as l is: the root's one place that marks items.
func prepareOf(it *bucket.Prepared, op bucket.Op, key string, l *Limit, p *bucket.Params, cost float64, reserve bool, lease string) error {
	err := store.Prepare(it, op, key, p, cost, reserve, lease)
	it.Leased = l.Leased // valid: a token bucket or a fixed window
	return err
}

// Apply performs op for the requests rs in one call of st, at the time
// at (zero: the store's clock). It checks every request first. It serves
// Limiter.TakeMulti and callers that hold requests of several limits
// (drip replay, drip simulate). A take of several requests is all or
// nothing. Keys must be distinct. A bad request is an error, with its
// index when rs holds several.
//
// Each request's limit is validated and resolved at each call. The
// params of the last 8 limits that do not depend on the key are kept,
// process-wide, so that a caller of a few limits skips that work. A
// caller that meets many limits compiles each once instead (the engine's
// plans: engine.PlanOf, Engine.Apply): drip serve's decisions do.
func Apply(ctx context.Context, st store.Store, op bucket.Op, at time.Time, rs ...Request) (Multi, error) {
	return apply(ctx, st, op, at, len(rs) > 1, rs)
}

// apply is Apply; multi names the request of an error even when there is
// one (Limiter.TakeMulti).
func apply(ctx context.Context, st store.Store, op bucket.Op, at time.Time, multi bool, rs []Request) (Multi, error) {
	var items []bucket.Prepared
	var res []bucket.Result
	if n := len(rs); n <= pooled {
		c := calls.Get().(*call)
		defer func() {
			for i := range n {
				c.items[i].Key, c.items[i].Lease = "", ""
			}
			calls.Put(c)
		}()
		items, res = c.items[:n], c.results[:n]
	} else {
		items, res = make([]bucket.Prepared, n), make([]bucket.Result, n)
	}
	for i := range rs {
		it, err := prepare(op, &rs[i], at)
		if err != nil {
			if multi {
				err = fmt.Errorf("requests[%d]: %w", i, err)
			}
			return Multi{}, err
		}
		items[i] = it
	}
	if err := store.CheckDistinct(items); err != nil {
		return Multi{}, err
	}
	if err := st.Apply(ctx, op, at, items, res); err != nil {
		return Multi{}, err
	}
	ds := make([]Decision, len(res))
	for i := range res {
		calendarHints(&res[i], &rs[i].Limit, &items[i].Params, at)
		ds[i] = DecisionOf(res[i], items[i].Params.Burst)
	}
	return combine(ds), nil
}

// recent holds the params of the last key-independent limits prepare
// resolved, so that the common cases of Apply's callers (one limit,
// many keys; a few limits in turn) skip validating them again. The
// engine's decisions do not use it: they are prepared by plans. A power
// of two.
var recent [8]atomic.Pointer[cachedParams]

// cachedParams is a limit and its params, immutable once stored.
type cachedParams struct {
	limit  Limit
	params bucket.Params
}

// paramsFor is l.Params(key), from recent when l is there.
func paramsFor(l *Limit, key string, at time.Time) (bucket.Params, error) {
	if l.Calendar != "" {
		return l.paramsAt(key, at) // the window of the decision's time: never cached
	}
	slot := &recent[limitSlot(l)]
	if c := slot.Load(); c != nil && c.limit == *l {
		return c.params, nil
	}
	p, err := l.Params(key)
	if err == nil && !l.keyDependent() {
		slot.Store(&cachedParams{*l, p})
	}
	return p, err
}

// limitSlot is where l is kept among the recent limits: a cheap mix of
// the fields that tell limits apart in practice. Two limits that share a
// slot only cost a validation when they alternate.
func limitSlot(l *Limit) int {
	h := math.Float64bits(l.Rate) ^ math.Float64bits(l.Burst)*31 ^ uint64(l.Period)*131
	h ^= h >> 29
	h *= 0x9E3779B97F4A7C15
	return int(h>>32) & (len(recent) - 1)
}
