package drip

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"math"
	"time"

	"github.com/driplimit/drip/bucket"
	"github.com/driplimit/drip/internal/calendar"
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
	// Lease is, for a concurrency limit (Algorithm Concurrency), the lease
	// ID a take acquires a slot under, a refund releases, or a peek asks
	// about (a peek without one asks whether a slot is free): 1 to
	// MaxLeaseLen bytes of printable ASCII, NewLeaseID's. Other limits
	// leave it empty. A concurrency take ignores Cost: a lease holds one
	// slot.
	Lease string
}

// prepare checks r for op and resolves it to fixed point: the key, then
// the limit, the cost and the lease, in that order, so that every caller
// reports the first problem the same way.
func prepare(op bucket.Op, r *Request, at time.Time) (bucket.Prepared, error) {
	if err := store.CheckKey(r.Key); err != nil {
		return bucket.Prepared{}, err
	}
	p, err := r.Limit.paramsAt(r.Key, at)
	if err != nil {
		return bucket.Prepared{}, err
	}
	return store.Prepare(op, r.Key, p, r.Cost, r.Reserve, r.Lease)
}

// Apply performs op for the requests rs in one call of st, at the time at
// (zero: the store's clock), after checking every request: the path of
// Limiter.TakeMulti, and of callers that hold requests of several limits
// (drip replay, the decision API). For a take of several requests it is
// all or nothing. A bad request is an error, with its index when rs holds
// several; keys must be distinct.
func Apply(ctx context.Context, st store.Store, op bucket.Op, at time.Time, rs ...Request) (Multi, error) {
	items := make([]bucket.Prepared, len(rs))
	for i := range rs {
		it, err := prepare(op, &rs[i], at)
		if err != nil {
			if len(rs) > 1 {
				err = fmt.Errorf("requests[%d]: %w", i, err)
			}
			return Multi{}, err
		}
		items[i] = it
	}
	if err := store.CheckDistinct(items); err != nil {
		return Multi{}, err
	}
	res := make([]bucket.Result, len(items))
	if err := st.Apply(ctx, op, at, items, res); err != nil {
		return Multi{}, err
	}
	ds := make([]Decision, len(res))
	for i, r := range res {
		ds[i] = DecisionOf(r, items[i].Params.Burst)
	}
	return combine(ds), nil
}

// Params validates l and resolves it to fixed point for key (the key
// matters only to a fixed window without Start, whose grid it places):
// what a store executes. Front doors that compile limits once call it.
// A calendar window's params are those of the window that holds the
// present instant: decisions resolve theirs at their own time.
func (l Limit) Params(key string) (bucket.Params, error) { return l.paramsAt(key, time.Time{}) }

// paramsAt is Params for a decision at t (zero: now, by the caller's
// clock, which places a calendar window when the store decides on its
// own clock: see bucket.Calendar).
func (l Limit) paramsAt(key string, t time.Time) (bucket.Params, error) {
	if err := l.Validate(); err != nil {
		return bucket.Params{}, err
	}
	l = l.forKey(key)
	if l.Algorithm == Concurrency {
		return bucket.Params{
			Kind:   bucket.Concurrency,
			Burst:  int64(l.MaxInFlight) * bucket.Micro,
			Period: int64(l.leaseTTL()),
		}, nil
	}
	p := bucket.Params{
		Rate:   toMicro(l.Rate),
		Period: int64(l.period()),
		Burst:  toMicro(l.burst()),
		// No bound on reservations is, in fixed point, the largest amount
		// drip takes (1e12 tokens): debt then stays far inside an int64,
		// and burst - tokens cannot overflow however many reservations
		// pile up.
		MaxReserved: toMicro(maxAmount),
	}
	if l.MaxReserved > 0 {
		p.MaxReserved = toMicro(l.MaxReserved)
	}
	switch {
	case l.Calendar != "":
		if t.IsZero() {
			t = time.Now()
		}
		u, _ := calendar.ParseUnit(l.Calendar) // valid
		start, end := calendar.Period{Unit: u, Loc: l.Location}.Window(t)
		p.Kind = bucket.Calendar
		p.Start = start.UnixNano()
		p.Period = end.Sub(start).Nanoseconds()
		p.Rate = p.Burst
	case l.Algorithm == SlidingWindow:
		// The window's slots must be at least a nanosecond long; the
		// limit is a count, so what a sliding window reserves never
		// matters (reserve is refused).
		p.Kind = bucket.Sliding
		p.Rate = p.Burst
		p.MaxReserved = 0
		p.Parts = int64(min(int64(l.slots()), p.Period))
	case l.Algorithm == FixedWindow:
		p.Kind = bucket.Window
		p.Start = int64(l.Start) % p.Period
	case l.Refill == Interval:
		p.Kind = bucket.Interval
	}
	return p, nil
}

func (l Limit) slots() int {
	if l.Slots == 0 {
		return bucket.DefaultSlots
	}
	return l.Slots
}

// keyDependent reports whether l's Params depend on the key, so that a
// Limiter resolves them at each decision.
// A calendar window's depend on the time: they are resolved at every
// decision.
func (l Limit) keyDependent() bool {
	return l.Algorithm == FixedWindow && (l.Start == 0 || l.Calendar != "")
}

// Concurrent reports whether l is a concurrency limit.
func (l Limit) Concurrent() bool { return l.Algorithm == Concurrency }

// MaxLeaseLen is the longest lease ID drip accepts, in bytes.
const MaxLeaseLen = store.MaxLeaseLen

// NewLeaseID returns a fresh random lease ID: 128 bits from crypto/rand,
// in 22 characters of unpadded base64url.
func NewLeaseID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return base64.RawURLEncoding.EncodeToString(b[:])
}

// DecisionOf is the Decision of a store's result for an item of a limit
// of burst micro-tokens (its bucket.Params.Burst): its amounts in tokens.
func DecisionOf(r bucket.Result, burst int64) Decision {
	return Decision{
		Allowed:    r.Allowed,
		Tokens:     float64(r.Tokens) / bucket.Micro,
		Remaining:  max(0, r.Tokens) / bucket.Micro,
		Burst:      float64(burst) / bucket.Micro,
		RetryAfter: r.RetryAfter,
		ResetAfter: r.ResetAfter,
	}
}

func toMicro(x float64) int64 { return int64(math.Round(x * bucket.Micro)) }
