package drip

import (
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"math"

	"github.com/driplimit/drip/bucket"
)

// This file turns what users write (a Limit, a Request, an Op) into the
// fixed point of package bucket, where the math is, and bucket's results
// back into Decisions. Store writers call it; users never need to.

// Op is what a store does with a request.
type Op uint8

const (
	OpTake Op = iota
	OpPeek
	OpRefund
)

// ErrInvalidOp is returned (wrapped) for an Op that is not OpTake, OpPeek
// or OpRefund. CostOf checks it, so every store refuses it the same way
// before it touches any state.
var ErrInvalidOp = errors.New("invalid op")

// checkOp reports an unknown op.
func checkOp(op Op) error {
	switch op {
	case OpTake, OpPeek, OpRefund:
		return nil
	}
	return fmt.Errorf("%w: %v is not take, peek or refund", ErrInvalidOp, op)
}

func (o Op) String() string {
	switch o {
	case OpTake:
		return "take"
	case OpPeek:
		return "peek"
	case OpRefund:
		return "refund"
	}
	return fmt.Sprintf("op(%d)", uint8(o))
}

// Prepare validates op and r and resolves r's limit and cost to fixed
// point, for bucket.Eval or a store's own script. Every store calls it (or
// ParamsOf and CostOf), so bad input gets the same error on every store.
// A prepared op is a bucket.Op of the same value: bucket.Op(op).
func Prepare(op Op, r Request) (bucket.Prepared, error) {
	if err := CheckKey(r.Key); err != nil {
		return bucket.Prepared{}, err
	}
	p, err := ParamsOf(r.Limit, r.Key)
	if err != nil {
		return bucket.Prepared{}, err
	}
	cost, err := CostOf(op, r.Cost, r.Reserve, p)
	if err != nil {
		return bucket.Prepared{}, err
	}
	if err := CheckLease(op, r.Lease, p); err != nil {
		return bucket.Prepared{}, err
	}
	return bucket.Prepared{Key: r.Key, Params: p, Cost: cost, Reserve: r.Reserve, Lease: r.Lease}, nil
}

// ParamsOf validates l and resolves it to fixed point for key (the key
// matters only to a fixed window without Start; see KeyDependent).
func ParamsOf(l Limit, key string) (bucket.Params, error) {
	if err := l.Validate(); err != nil {
		return bucket.Params{}, err
	}
	l = l.ForKey(key)
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
	case l.Algorithm == FixedWindow:
		p.Kind = bucket.Window
		p.Start = int64(l.Start) % p.Period
	case l.Refill == Interval:
		p.Kind = bucket.Interval
	}
	return p, nil
}

// KeyDependent reports whether l's Params depend on the key, so that a
// store may cache ParamsOf(l, "") for every key when it does not.
func (l Limit) KeyDependent() bool { return l.Algorithm == FixedWindow && l.Start == 0 }

// Concurrent reports whether l is a concurrency limit.
func (l Limit) Concurrent() bool { return l.Algorithm == Concurrency }

// CostOf checks op, and a request's cost against params p, and turns the
// cost to fixed point (bucket.CostMicro): the cost part of Prepare, for
// stores that keep the rest. It is the one place an unknown op is refused.
//
// A take or peek that can never be allowed is an error rather than a
// denial, because no wait would help: a cost above the burst without
// reserve, or with reserve a cost above the burst plus MaxReserved (a
// bounded reservation needs the bucket to hold cost - MaxReserved, more
// than it ever holds). Without a bound (MaxReserved 0) a reservation of any
// valid cost fits. A refund takes any valid cost: it may give back a
// reservation larger than the burst, and the bucket is capped at its burst.
func CostOf(op Op, cost float64, reserve bool, p bucket.Params) (int64, error) {
	if err := checkOp(op); err != nil {
		return 0, err
	}
	if math.IsNaN(cost) || math.IsInf(cost, 0) || cost < 0 || cost > maxAmount {
		return 0, fmt.Errorf("%w: %v (must be a finite number from 0 to %g)", ErrInvalidCost, cost, float64(maxAmount))
	}
	c := bucket.CostMicro(cost)
	if p.Kind == bucket.Concurrency {
		// A lease holds one slot, whatever the cost says.
		if reserve {
			return 0, fmt.Errorf("%w: reserve does not apply to a concurrency limit", ErrInvalidCost)
		}
		return bucket.Micro, nil
	}
	switch {
	case op == OpRefund || c <= p.Burst:
	case !reserve:
		return 0, fmt.Errorf("%w: cost %v > burst %v can never succeed without reserve", ErrCostExceedsBurst, cost, float64(p.Burst)/bucket.Micro)
	case p.MaxReserved >= 0 && c-p.Burst > p.MaxReserved:
		return 0, fmt.Errorf("%w: cost %v > burst %v + max_reserved %v can never be reserved", ErrCostExceedsBurst, cost, float64(p.Burst)/bucket.Micro, float64(p.MaxReserved)/bucket.Micro)
	}
	return c, nil
}

// MaxLeaseLen is the longest lease ID drip accepts, in bytes.
const MaxLeaseLen = 64

// ErrInvalidLease is returned (wrapped) for a lease ID that is missing
// where one is needed (a take or refund on a concurrency limit), too long,
// not printable ASCII, or given for a limit that is not a concurrency one.
var ErrInvalidLease = errors.New("invalid lease")

// CheckLease checks a request's lease ID for op under params p: a take or
// refund on a concurrency limit needs one; a peek may name one or not;
// other limits take none. IDs are 1 to MaxLeaseLen bytes of printable
// ASCII (NewLeaseID makes such IDs). Prepare calls it.
func CheckLease(op Op, id string, p bucket.Params) error {
	if p.Kind != bucket.Concurrency {
		if id != "" {
			return fmt.Errorf("%w: a lease applies to a concurrency limit only", ErrInvalidLease)
		}
		return nil
	}
	if id == "" {
		if op == OpPeek {
			return nil
		}
		return fmt.Errorf("%w: a %v on a concurrency limit needs a lease", ErrInvalidLease, op)
	}
	if len(id) > MaxLeaseLen {
		return fmt.Errorf("%w: %d bytes, at most %d", ErrInvalidLease, len(id), MaxLeaseLen)
	}
	for i := 0; i < len(id); i++ {
		if id[i] < 0x21 || id[i] > 0x7e {
			return fmt.Errorf("%w: byte %d is not printable ASCII", ErrInvalidLease, i)
		}
	}
	return nil
}

// NewLeaseID returns a fresh random lease ID: 128 bits from crypto/rand,
// in 22 characters of unpadded base64url.
func NewLeaseID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return base64.RawURLEncoding.EncodeToString(b[:])
}

// PrepareMulti prepares every request of a multi-take; keys must be
// distinct. The first bad request's error is returned, with its index.
func PrepareMulti(op Op, rs []Request) ([]bucket.Prepared, error) {
	if len(rs) == 0 {
		return nil, ErrNoRequests
	}
	ps := make([]bucket.Prepared, len(rs))
	seen := make(map[string]int, len(rs))
	for i, r := range rs {
		p, err := Prepare(op, r)
		if err != nil {
			return nil, fmt.Errorf("requests[%d]: %w", i, err)
		}
		if j, dup := seen[r.Key]; dup {
			return nil, fmt.Errorf("requests[%d]: %w (the key of requests[%d])", i, ErrDuplicateKey, j)
		}
		seen[r.Key] = i
		ps[i] = p
	}
	return ps, nil
}

// DecisionOf is the Decision of a result of bucket.Eval (or of a store's
// script that computes the same) under a limit of burst micro-tokens
// (its Params.Burst): its amounts in tokens.
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

// MultiOf is the Multi of the results of bucket.EvalMulti (or
// EvalMultiLeases) for the
// requests ps: Combine of their decisions.
func MultiOf(rs []bucket.Result, ps []bucket.Prepared) Multi {
	ds := make([]Decision, len(rs))
	for i, r := range rs {
		ds[i] = DecisionOf(r, ps[i].Params.Burst)
	}
	return Combine(ds)
}
