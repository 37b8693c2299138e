package drip

import (
	"errors"
	"fmt"
	"math"
	"math/bits"
	"time"
)

// This file is the math of docs/semantics.md, written once. It is a pure
// function of (bucket, params, now, request): no I/O, no clock. The Lua and
// SQL versions in the stores are held to it by storetest.
//
// Representation. Amounts are int64 millionths of a token; times are int64
// nanoseconds. Interval and fixed-window refills are then exact integer
// arithmetic. A continuous refill of e nanoseconds adds e*Rate/Period
// micro-tokens, a rational number: the whole micro-tokens are added and the
// remainder is kept by leaving TS behind now by the time that remainder is
// worth (less than one micro-token's worth). Refill is therefore never lost
// to rounding except for under one nanosecond's worth per decision, and
// never over-granted: tokens granted differ from exact arithmetic by at most
// min(1, Rate/Period) micro-tokens per decision that refills a bucket which
// is not full (for 10/s that is 1e-8 token), and by nothing once a bucket
// fills. Stores may keep TS exactly as the math returns it.

// Kind is a limit's refill rule, as the math sees it.
type Kind uint8

const (
	KindContinuous Kind = iota // token bucket, continuous refill
	KindInterval               // token bucket, refill on a grid
	KindWindow                 // fixed window
)

// Params is a validated limit in fixed point: what the math and the stores'
// scripts take. Rate, Burst and MaxReserved are micro-tokens; Period and
// Start are nanoseconds. MaxReserved < 0 means no bound; ParamsOf never
// makes one (an unbounded limit gets 1e12 tokens, see there).
type Params struct {
	Kind        Kind
	Rate        int64
	Period      int64
	Burst       int64
	MaxReserved int64
	Start       int64
}

// Bucket is the stored state of one key: Tokens in micro-tokens (negative
// while a reservation is in debt) and TS in nanoseconds.
type Bucket struct {
	Tokens int64
	TS     int64
}

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

// Prepared is a request checked and turned into fixed point.
type Prepared struct {
	Key     string
	Params  Params
	Cost    int64
	Reserve bool
}

// Prepare validates op and r and resolves r's limit and cost to fixed
// point. Every store calls it (or PrepareWith, or CostOf), so bad input
// gets the same error on every store.
func Prepare(op Op, r Request) (Prepared, error) {
	if err := CheckKey(r.Key); err != nil {
		return Prepared{}, err
	}
	p, err := ParamsOf(r.Limit, r.Key)
	if err != nil {
		return Prepared{}, err
	}
	return PrepareWith(op, r, p)
}

// ParamsOf validates l and resolves it to fixed point for key (the key
// matters only to a fixed window without Start; see KeyDependent).
func ParamsOf(l Limit, key string) (Params, error) {
	if err := l.Validate(); err != nil {
		return Params{}, err
	}
	l = l.ForKey(key)
	p := Params{
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
		p.Kind = KindWindow
		p.Start = int64(l.Start) % p.Period
	case l.Refill == Interval:
		p.Kind = KindInterval
	}
	return p, nil
}

// KeyDependent reports whether l's Params depend on the key, so that a
// store may cache ParamsOf(l, "") for every key when it does not.
func (l Limit) KeyDependent() bool { return l.Algorithm == FixedWindow && l.Start == 0 }

// PrepareWith checks op, and r's key and cost against params p (from
// ParamsOf for r.Limit and r.Key), and turns the cost to fixed point.
func PrepareWith(op Op, r Request, p Params) (Prepared, error) {
	if err := CheckKey(r.Key); err != nil {
		return Prepared{}, err
	}
	cost, err := CostOf(op, r.Cost, r.Reserve, p)
	if err != nil {
		return Prepared{}, err
	}
	return Prepared{Key: r.Key, Params: p, Cost: cost, Reserve: r.Reserve}, nil
}

// CostOf checks op, and a request's cost against params p, and turns the
// cost to fixed point: the cost part of PrepareWith, for stores that keep
// the rest. It is the one place an unknown op is refused.
//
// A take or peek that can never be allowed is an error rather than a
// denial, because no wait would help: a cost above the burst without
// reserve, or with reserve a cost above the burst plus MaxReserved (a
// bounded reservation needs the bucket to hold cost - MaxReserved, more
// than it ever holds). Without a bound (MaxReserved 0) a reservation of any
// valid cost fits. A refund takes any valid cost: it may give back a
// reservation larger than the burst, and the bucket is capped at its burst.
func CostOf(op Op, cost float64, reserve bool, p Params) (int64, error) {
	if err := checkOp(op); err != nil {
		return 0, err
	}
	if math.IsNaN(cost) || math.IsInf(cost, 0) || cost < 0 || cost > maxAmount {
		return 0, fmt.Errorf("%w: %v (must be a finite number from 0 to %g)", ErrInvalidCost, cost, float64(maxAmount))
	}
	c := CostMicro(cost)
	switch {
	case op == OpRefund || c <= p.Burst:
	case !reserve:
		return 0, fmt.Errorf("%w: cost %v > burst %v can never succeed without reserve", ErrCostExceedsBurst, cost, float64(p.Burst)/Micro)
	case p.MaxReserved >= 0 && c-p.Burst > p.MaxReserved:
		return 0, fmt.Errorf("%w: cost %v > burst %v + max_reserved %v can never be reserved", ErrCostExceedsBurst, cost, float64(p.Burst)/Micro, float64(p.MaxReserved)/Micro)
	}
	return c, nil
}

// Fresh is the bucket of a key never seen before (or expired) at now: full,
// with TS now, or for a fixed window the start of the current window.
func (p Params) Fresh(now int64) Bucket {
	ts := now
	if p.Kind == KindWindow {
		ts = now - floorMod(now-p.Start, p.Period)
	}
	return Bucket{Tokens: p.Burst, TS: ts}
}

// Refilled is b brought forward to now: the tokens available and the new
// TS. A clock that went backwards (now < TS) changes nothing.
func (p Params) Refilled(b Bucket, now int64) Bucket {
	if now <= b.TS {
		b.Tokens = min(b.Tokens, p.Burst)
		return b
	}
	e := now - b.TS
	missing := p.Burst - b.Tokens
	if p.Kind == KindContinuous {
		if missing <= 0 {
			return Bucket{Tokens: p.Burst, TS: now}
		}
		hi, lo := bits.Mul64(uint64(e), uint64(p.Rate))
		if hi == 0 && lo < uint64(p.Period) {
			// Under one micro-token's worth: nothing to add, and TS stays
			// (now - lo/Rate is now - e), without dividing.
			return b
		}
		if hi >= uint64(p.Period) {
			return Bucket{Tokens: p.Burst, TS: now}
		}
		q, rem := bits.Div64(hi, lo, uint64(p.Period))
		if q >= uint64(missing) {
			return Bucket{Tokens: p.Burst, TS: now}
		}
		return Bucket{Tokens: b.Tokens + int64(q), TS: now - int64(rem/uint64(p.Rate))}
	}
	// Interval and fixed window: whole periods only, and the grid stays put
	// even while the bucket is full.
	n := e / p.Period
	b.TS += n * p.Period
	if missing <= 0 || n >= ceilDiv(missing, p.Rate) {
		b.Tokens = p.Burst
	} else {
		b.Tokens += n * p.Rate
	}
	return b
}

// Until is how long after now the bucket b (already refilled to now) holds
// at least target micro-tokens. It is 0 when it already does. For interval
// and fixed-window refills the answer lands on the grid.
func (p Params) Until(b Bucket, target, now int64) time.Duration {
	if b.Tokens >= target {
		return 0
	}
	return untilAt(p.reach(b, target), now)
}

// untilAt is how long after now the instant r is (0 if it has passed).
func untilAt(r, now int64) time.Duration {
	if now < 0 && r > math.MaxInt64+now {
		return time.Duration(math.MaxInt64)
	}
	return time.Duration(max(0, r-now))
}

// reach is the instant at which b holds target micro-tokens (b.TS if it
// already does), saturating at MaxInt64.
func (p Params) reach(b Bucket, target int64) int64 {
	need := target - b.Tokens
	if need <= 0 {
		return b.TS
	}
	var d int64
	if p.Kind == KindContinuous {
		d = mulDivCeil(need, p.Period, p.Rate)
	} else {
		k := ceilDiv(need, p.Rate)
		if k > math.MaxInt64/p.Period {
			return math.MaxInt64
		}
		d = k * p.Period
	}
	if b.TS > 0 && d > math.MaxInt64-b.TS {
		return math.MaxInt64
	}
	return b.TS + d
}

// ExpiresAt is the instant from which the stored bucket b carries no
// information, so a store may drop it and Eval treats it as fresh: when it
// is full again, and for an interval refill one whole period later (until
// then the bucket keeps its grid; after a full period of being full, the
// next request starts a new grid). Stores set their TTLs from it.
func (p Params) ExpiresAt(b Bucket) int64 { return p.expiresAt(p.reach(b, p.Burst)) }

// expiresAt is ExpiresAt of a bucket that is full again at t.
func (p Params) expiresAt(t int64) int64 {
	if p.Kind == KindInterval {
		if t > math.MaxInt64-p.Period {
			return math.MaxInt64
		}
		t += p.Period
	}
	return t
}

// NeedFor is how many micro-tokens a bucket must hold for a take of cost
// to be allowed: cost, or for a reservation with a bound on the debt, cost
// less that bound (a reservation without a bound is always allowed). A
// denial's RetryAfter is the wait until the bucket holds it.
func (p Params) NeedFor(cost int64, reserve bool) int64 {
	if reserve && p.MaxReserved >= 0 {
		return cost - p.MaxReserved
	}
	return cost
}

// Eval decides one request against bucket b (found reports whether the key
// had state) at now. It returns the decision, the bucket to store, and
// whether it must be written: a denial or a peek writes nothing.
func Eval(op Op, b Bucket, found bool, p Params, cost int64, reserve bool, now int64) (Decision, Bucket, bool) {
	// full is when b is full again, kept for ResetAfter while the bucket
	// stays as it was (a denial or a peek on a hot key), to divide once.
	var full int64
	if found {
		full = p.reach(b, p.Burst)
	}
	if !found || now >= p.expiresAt(full) {
		b = p.Fresh(now)
		full = b.TS
	}
	a := p.Refilled(b, now)
	resetAfter := func(n Bucket) time.Duration {
		if n == b && n.Tokens < p.Burst {
			return untilAt(full, now)
		}
		return p.Until(n, p.Burst, now)
	}
	switch op {
	case OpRefund:
		n := Bucket{Tokens: min(p.Burst, a.Tokens+cost), TS: a.TS}
		return p.decide(true, n, 0, resetAfter(n)), n, true
	}
	allowed := false
	var retry time.Duration
	n := a
	switch {
	case a.Tokens >= cost:
		allowed = true
		n.Tokens -= cost
	case reserve && (p.MaxReserved < 0 || cost-a.Tokens <= p.MaxReserved):
		allowed = true
		n.Tokens -= cost
		retry = p.Until(n, 0, now)
	default:
		retry = p.Until(a, p.NeedFor(cost, reserve), now)
	}
	d := p.decide(allowed, n, retry, resetAfter(n))
	return d, n, allowed && op == OpTake
}

func (p Params) decide(allowed bool, b Bucket, retry, reset time.Duration) Decision {
	return Decision{
		Allowed:    allowed,
		Tokens:     float64(b.Tokens) / Micro,
		Remaining:  max(0, b.Tokens) / Micro,
		Burst:      float64(p.Burst) / Micro,
		RetryAfter: retry,
		ResetAfter: reset,
	}
}

func ceilDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && (a > 0) == (b > 0) {
		q++
	}
	return q
}

func floorMod(a, m int64) int64 {
	r := a % m
	if r < 0 {
		r += m
	}
	return r
}

// mulDivCeil returns ceil(a*b/c) for a, b >= 0 and c > 0, saturating at
// MaxInt64.
func mulDivCeil(a, b, c int64) int64 {
	hi, lo := bits.Mul64(uint64(a), uint64(b))
	if hi >= uint64(c) {
		return math.MaxInt64
	}
	q, rem := bits.Div64(hi, lo, uint64(c))
	if rem != 0 {
		q++
	}
	if q > math.MaxInt64 {
		return math.MaxInt64
	}
	return int64(q)
}

// PrepareMulti prepares every request of a multi-take; keys must be
// distinct. The first bad request's error is returned, with its index.
func PrepareMulti(op Op, rs []Request) ([]Prepared, error) {
	if len(rs) == 0 {
		return nil, ErrNoRequests
	}
	ps := make([]Prepared, len(rs))
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

// EvalMulti decides prepared requests (distinct keys) against their
// buckets as one step. It returns the Multi and, for each request, the
// bucket to store and whether to write it: for OpTake nothing is written
// unless every request is allowed.
func EvalMulti(op Op, ps []Prepared, buckets []Bucket, found []bool, now int64) (Multi, []Bucket, []bool) {
	ds := make([]Decision, len(ps))
	next := make([]Bucket, len(ps))
	write := make([]bool, len(ps))
	for i, p := range ps {
		ds[i], next[i], write[i] = Eval(op, buckets[i], found[i], p.Params, p.Cost, p.Reserve, now)
	}
	m := Combine(ds)
	if !m.Allowed && op == OpTake {
		clear(write)
	}
	return m, next, write
}
