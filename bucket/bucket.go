// Package bucket is drip's fixed-point math, for store writers: a limit's
// Params, a key's State, and Eval, the one decision of docs/semantics.md as
// a pure function of (state, params, now, request). It does no I/O, reads
// no clock and imports the standard library only. Package drip converts a
// Limit into Params (drip.Limit.Params), package store checks a request
// into a Prepared item (store.Prepare, store.Cost), and drip turns a
// Result back into a Decision (drip.DecisionOf); users never need it.
package bucket

import (
	"math"
	"math/bits"
	"strconv"
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

// Micro is how many fixed-point units make one token: amounts (rates,
// bursts, costs, tokens) are int64 micro-tokens.
const Micro = 1_000_000

// Result is what Eval decides, in fixed point: drip.DecisionOf turns it,
// with the limit's Burst, into a drip.Decision. (It has four fields, so
// that the compiler keeps it in registers on a store's hot path.)
type Result struct {
	// Allowed reports whether the request was allowed.
	Allowed bool
	// Tokens is the state's tokens after the decision (for a denial, what
	// was available), in micro-tokens; negative while in debt.
	Tokens int64
	// RetryAfter and ResetAfter are as in drip.Decision.
	RetryAfter time.Duration
	ResetAfter time.Duration
}

// Kind is a limit's refill rule, as the math sees it.
type Kind uint8

const (
	Continuous Kind = iota // token bucket, continuous refill
	Interval               // token bucket, refill on a grid
	Window                 // fixed window
)

// Params is a validated limit in fixed point: what the math and the stores'
// scripts take. Rate, Burst and MaxReserved are micro-tokens; Period and
// Start are nanoseconds. MaxReserved < 0 means no bound; drip.Limit.Params never
// makes one (an unbounded limit gets 1e12 tokens, see there).
type Params struct {
	Kind        Kind
	Rate        int64
	Period      int64
	Burst       int64
	MaxReserved int64
	Start       int64
	// Parts is, for a sliding window (Kind Sliding), how many slots its
	// window is cut into (1 to MaxSlots); other kinds leave it zero.
	Parts int64
}

// State is the stored state of one key: Tokens in micro-tokens (negative
// while a reservation is in debt) and TS in nanoseconds.
type State struct {
	Tokens int64
	TS     int64
}

// Op is what Eval (and a store) does with a request; store.CheckOp (in
// store.Cost and store.Prepare) refuses any other value.
type Op uint8

const (
	Take   Op = iota // take cost, or deny
	Peek             // decide as Take would, and write nothing
	Refund           // give cost back, up to the burst
)

func (o Op) String() string {
	switch o {
	case Take:
		return "take"
	case Peek:
		return "peek"
	case Refund:
		return "refund"
	}
	return "op(" + strconv.Itoa(int(o)) + ")"
}

// Prepared is a request checked and turned into fixed point (store.Prepare
// makes it): Cost in micro-tokens, under Params.
type Prepared struct {
	Key     string
	Params  Params
	Cost    int64
	Reserve bool
	// Lease is, for a concurrency limit, the lease a take acquires, a
	// refund releases or a peek asks about.
	Lease string
	// Block is, for a take or a refund of leased tokens (EvalBlocks), the
	// ID of the block taken or returned; BlockTTL is a block take's life
	// in nanoseconds. Empty for any other request.
	Block    string
	BlockTTL int64
	// Leased reports that the item's limit is marked leased
	// (drip.Limit.Leased): package leased under its Marked option leases
	// only such items. Every store that holds blocks decides every item
	// under its key's blocks, whatever this says.
	Leased bool
}

// Fresh is the bucket of a key never seen before (or expired) at now: full,
// with TS now, or for a fixed window the start of the current window.
func (p Params) Fresh(now int64) State {
	ts := now
	if p.Kind == Window || p.Kind == Calendar {
		// now - ((now - Start) mod Period), without computing now - Start,
		// which overflows for a period of centuries before 1970.
		m := floorMod(now, p.Period) - floorMod(p.Start, p.Period)
		if m < 0 {
			m += p.Period
		}
		ts = now - m
	}
	return State{Tokens: p.Burst, TS: ts}
}

// Refilled is b brought forward to now: the tokens available and the new
// TS. A clock that went backwards (now < TS) changes nothing.
func (p Params) Refilled(b State, now int64) State {
	if now <= b.TS {
		b.Tokens = min(b.Tokens, p.Burst)
		return b
	}
	e := now - b.TS
	missing := p.Burst - b.Tokens
	if p.Kind == Continuous {
		if missing <= 0 {
			return State{Tokens: p.Burst, TS: now}
		}
		hi, lo := bits.Mul64(uint64(e), uint64(p.Rate))
		if hi == 0 && lo < uint64(p.Period) {
			// Under one micro-token's worth: nothing to add, and TS stays
			// (now - lo/Rate is now - e), without dividing.
			return b
		}
		if hi >= uint64(p.Period) {
			return State{Tokens: p.Burst, TS: now}
		}
		// Full again once e*Rate >= missing*Period: the common case on a
		// key used now and then, decided by a multiply, not the divide.
		if mh, ml := bits.Mul64(uint64(missing), uint64(p.Period)); hi > mh || hi == mh && lo >= ml {
			return State{Tokens: p.Burst, TS: now}
		}
		q, rem := bits.Div64(hi, lo, uint64(p.Period))
		if q >= uint64(missing) {
			return State{Tokens: p.Burst, TS: now}
		}
		return State{Tokens: b.Tokens + int64(q), TS: now - int64(rem/uint64(p.Rate))}
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
func (p Params) Until(b State, target, now int64) time.Duration {
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
func (p Params) reach(b State, target int64) int64 {
	need := target - b.Tokens
	if need <= 0 {
		return b.TS
	}
	var d int64
	if p.Kind == Continuous {
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
func (p Params) ExpiresAt(b State) int64 { return p.expiresAt(p.reach(b, p.Burst)) }

// expiresAt is ExpiresAt of a bucket that is full again at t.
func (p Params) expiresAt(t int64) int64 {
	if p.Kind == Interval {
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

// Eval decides one request of cost micro-tokens against the state b of its
// key (found reports whether the key had state) at now. It returns the
// result, the state to store, and whether it must be written: a denial or
// a peek writes nothing. cost must have passed store.Cost (or store.Prepare) for
// p, and op be Take, Peek or Refund.
func Eval(op Op, b State, found bool, p Params, cost int64, reserve bool, now int64) (Result, State, bool) {
	// full is when b is full again, kept for ResetAfter while the bucket
	// stays as it was (a denial or a peek on a hot key), to divide once.
	if p.Kind == Calendar {
		found, now = p.calendarNow(b, found, now)
	}
	var full int64
	if found {
		full = p.reach(b, p.Burst)
	}
	if !found || now >= p.expiresAt(full) {
		b = p.Fresh(now)
		full = b.TS
	}
	a := p.Refilled(b, now)
	resetAfter := func(n State) time.Duration {
		if n == b && n.Tokens < p.Burst {
			return untilAt(full, now)
		}
		return p.Until(n, p.Burst, now)
	}
	switch op {
	case Refund:
		n := State{Tokens: min(p.Burst, a.Tokens+cost), TS: a.TS}
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
	return d, n, allowed && op == Take
}

// Admit decides a take of cost micro-tokens, without reserve, exactly as
// Eval(Take, b, found, p, cost, false, now) does, and returns only what
// a caller that wants a yes or no needs: whether it is allowed, and the
// state to store when it is (a denial writes nothing). It computes no
// waits, so a denial on a busy key costs no division. cost must have
// passed store.Cost for p.
func Admit(b State, found bool, p Params, cost int64, now int64) (bool, State) {
	switch {
	case !found:
		b = p.Fresh(now)
	case p.Kind != Continuous:
		if now >= p.ExpiresAt(b) {
			b = p.Fresh(now)
		}
		// A continuous bucket needs no such check: from the instant it is
		// full again Refilled returns {Burst, now}, which is its Fresh.
	}
	a := p.Refilled(b, now)
	if a.Tokens < cost {
		return false, b
	}
	a.Tokens -= cost
	return true, a
}

func (p Params) decide(allowed bool, b State, retry, reset time.Duration) Result {
	return Result{Allowed: allowed, Tokens: b.Tokens, RetryAfter: retry, ResetAfter: reset}
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

// EvalMulti decides prepared requests (distinct keys) against their
// states as one step at now. It returns each request's result, the state
// to store and whether to write it: for Take nothing is written unless
// every request is allowed. It takes no concurrency requests; see
// EvalMultiLeases.
func EvalMulti(op Op, ps []Prepared, states []State, found []bool, now int64) ([]Result, []State, []bool) {
	return EvalMultiLeases(op, ps, states, found, nil, now)
}

// EvalMultiLeases is EvalMulti for requests of any kind but Sliding: a
// request of Kind Concurrency is decided by EvalLeases on leases[i], the
// summary of its key's leases (its states[i] and found[i] are unused), the
// others by Eval. All or nothing holds across kinds: for Take nothing is
// written unless every request is allowed. leases may be nil when no
// request is a concurrency one.
func EvalMultiLeases(op Op, ps []Prepared, states []State, found []bool, leases []LeaseSet, now int64) ([]Result, []State, []bool) {
	rs, next, _, _, write := EvalMultiAll(op, ps, states, found, leases, nil, nil, now)
	return rs, next, write
}

// EvalMultiAll is EvalMultiLeases for requests of every kind: a request
// of Kind Sliding is decided by EvalSliding on slides[i], its key's
// sliding state (found when its Counts are not nil), and its state to
// write is returned in the third result; a request whose key may hold
// blocks of leased tokens (blocks[i], or a request for a block) is
// decided by EvalBlocks, and its blocks to store are returned in the
// fourth. slides and blocks may be nil when no request is a sliding
// window, and when no key holds blocks and no request is a block's.
func EvalMultiAll(op Op, ps []Prepared, states []State, found []bool, leases []LeaseSet, slides []SlidingState, blocks [][]Block, now int64) ([]Result, []State, []SlidingState, [][]Block, []bool) {
	rs := make([]Result, len(ps))
	next := make([]State, len(ps))
	var nextSlides []SlidingState
	if slides != nil {
		nextSlides = make([]SlidingState, len(ps))
	}
	var nextBlocks [][]Block
	if blocks != nil {
		nextBlocks = make([][]Block, len(ps))
	}
	write := make([]bool, len(ps))
	all := true
	for i := range ps {
		p := &ps[i]
		switch {
		case p.Params.Kind == Concurrency:
			rs[i], write[i] = p.Params.EvalLeases(op, leases[i], p.Lease, now)
		case p.Params.Kind == Sliding:
			rs[i], nextSlides[i], write[i] = EvalSliding(op, slides[i], slides[i].Counts != nil, p.Params.Sliding(), p.Cost, now)
		case blocks != nil:
			rs[i], next[i], nextBlocks[i], write[i] = EvalBlocks(op, states[i], found[i], blocks[i], p, now)
		default:
			rs[i], next[i], write[i] = Eval(op, states[i], found[i], p.Params, p.Cost, p.Reserve, now)
		}
		all = all && rs[i].Allowed
	}
	if !all && op == Take {
		clear(write)
	}
	return rs, next, nextSlides, nextBlocks, write
}
