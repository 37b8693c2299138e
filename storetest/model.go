package storetest

import (
	"math"
	"math/big"
	"time"

	"github.com/driplimit/drip"
	"github.com/driplimit/drip/bucket"
	"github.com/driplimit/drip/store"
)

// Model is the reference model of docs/semantics.md in exact rational
// arithmetic: tokens and times are big.Rat, with ts = max(ts, now) exactly
// as the semantics write it. It is slow and obviously right; stores are
// compared against it. It never drops state.
type Model struct {
	buckets map[string]*modelBucket
	logs    map[string]*slidingLog // sliding windows (slidingmodel.go)
	// Calendar windows (calendarmodel.go): each key's count, and the
	// limit its last request named (Prepare notes it).
	counts    map[string]calendarCount
	calendars map[string]drip.Limit
	blocks    map[string][]mblock // live blocks of leased tokens (model_blocks.go)
	// grid is the offset of every sliding window's slot grid from the
	// epoch's (bucket.Params.Start), as the store it is compared with
	// moves it (gridMoved); 0 unless a runner sets it.
	grid int64
}

type modelBucket struct {
	tokens, ts *big.Rat // tokens in tokens, ts in nanoseconds
}

// NewModel returns an empty model.
func NewModel() *Model {
	return &Model{buckets: map[string]*modelBucket{}, logs: map[string]*slidingLog{},
		counts: map[string]calendarCount{}, calendars: map[string]drip.Limit{}, blocks: map[string][]mblock{}}
}

// ModelDecision is a decision in exact arithmetic.
type ModelDecision struct {
	Allowed           bool
	Tokens            *big.Rat
	RetryNs, ResetNs  *big.Rat
	Burst, Cost, Need *big.Rat
}

type mlimit struct {
	kind                bucket.Kind
	rate, period, burst *big.Rat
	maxReserved         *big.Rat // nil: no bound
	start               *big.Rat
}

// modelLimit reads a limit exactly as a user wrote it (rounded to the
// micro-token, as drip documents).
func modelLimit(p bucket.Params) mlimit {
	m := mlimit{
		kind:   p.Kind,
		rate:   big.NewRat(p.Rate, bucket.Micro),
		period: new(big.Rat).SetInt64(p.Period),
		burst:  big.NewRat(p.Burst, bucket.Micro),
		start:  new(big.Rat).SetInt64(p.Start),
	}
	if p.MaxReserved >= 0 {
		m.maxReserved = big.NewRat(p.MaxReserved, bucket.Micro)
	}
	return m
}

func minRat(a, b *big.Rat) *big.Rat {
	if a.Cmp(b) < 0 {
		return a
	}
	return b
}

func floorRat(r *big.Rat) *big.Int {
	q := new(big.Int)
	m := new(big.Int)
	q.DivMod(r.Num(), r.Denom(), m) // Euclidean: floor for positive denominators
	return q
}

func ceilRat(r *big.Rat) *big.Int {
	f := floorRat(r)
	if new(big.Rat).SetInt(f).Cmp(r) != 0 {
		f.Add(f, big.NewInt(1))
	}
	return f
}

func (m *Model) state(key string, l mlimit, now *big.Rat) (tokens, ts *big.Rat) {
	b, ok := m.buckets[key]
	return stateOf(b, ok, l, now)
}

// stateOf is the bucket b (ok: the key has state) at now.
func stateOf(b *modelBucket, ok bool, l mlimit, now *big.Rat) (tokens, ts *big.Rat) {
	if ok && l.kind == bucket.Interval {
		// An interval bucket full for a whole period starts a new grid
		// (bucket.Params.ExpiresAt); the stale state stays until a write.
		full := new(big.Rat).Add(b.ts, l.until(b.tokens, b.ts, l.burst, b.ts))
		if now.Cmp(full.Add(full, l.period)) >= 0 {
			ok = false
		}
	}
	if !ok {
		ts := new(big.Rat).Set(now)
		if l.kind == bucket.Window {
			// ts = now - ((now - start) mod period)
			d := new(big.Rat).Sub(now, l.start)
			k := floorRat(new(big.Rat).Quo(d, l.period))
			ts = new(big.Rat).Add(l.start, new(big.Rat).Mul(new(big.Rat).SetInt(k), l.period))
		}
		return new(big.Rat).Set(l.burst), ts
	}
	tokens = new(big.Rat).Set(b.tokens)
	ts = new(big.Rat).Set(b.ts)
	if now.Cmp(ts) <= 0 {
		return minRat(tokens, l.burst), ts
	}
	e := new(big.Rat).Sub(now, ts)
	if l.kind == bucket.Continuous {
		add := new(big.Rat).Quo(new(big.Rat).Mul(e, l.rate), l.period)
		return minRat(tokens.Add(tokens, add), l.burst), new(big.Rat).Set(now)
	}
	n := new(big.Rat).SetInt(floorRat(new(big.Rat).Quo(e, l.period)))
	tokens.Add(tokens, new(big.Rat).Mul(n, l.rate))
	ts.Add(ts, new(big.Rat).Mul(n, l.period))
	return minRat(tokens, l.burst), ts
}

func (l mlimit) until(tokens, ts, target, now *big.Rat) *big.Rat {
	need := new(big.Rat).Sub(target, tokens)
	if need.Sign() <= 0 {
		return new(big.Rat)
	}
	var d *big.Rat
	if l.kind == bucket.Continuous {
		d = new(big.Rat).Quo(new(big.Rat).Mul(need, l.period), l.rate)
	} else {
		k := ceilRat(new(big.Rat).Quo(need, l.rate))
		d = new(big.Rat).Mul(new(big.Rat).SetInt(k), l.period)
	}
	t := new(big.Rat).Sub(new(big.Rat).Add(ts, d), now)
	if t.Sign() < 0 {
		return new(big.Rat)
	}
	return t
}

// Apply decides a prepared request at now (ns). follow, when not nil,
// is the store's answer: where the exact answer and the store's differ by
// less than tol tokens (drip's documented fixed-point tolerance), the model
// follows the store, so both keep the same state.
func (m *Model) Apply(op bucket.Op, p bucket.Prepared, at time.Time, write bool, follow *drip.Decision, tol *big.Rat) ModelDecision {
	if p.Params.Kind == bucket.Sliding {
		return m.applySliding(op, p, at, write)
	}
	if l, ok := m.calendars[p.Key]; ok {
		return m.applyCalendar(op, p, l, at, write)
	}
	l := modelLimit(p.Params)
	now := new(big.Rat).SetInt64(at.UnixNano())
	cost := big.NewRat(p.Cost, bucket.Micro)
	tokens, ts := m.state(p.Key, l, now)
	var live []mblock
	blocky := len(m.blocks[p.Key]) > 0 || p.Block != ""
	if blocky {
		tokens, ts, live, l = m.advance(p.Key, l, now)
		if p.Block != "" && op != bucket.Peek {
			return m.applyBlock(op, p, l, tokens, ts, live, at, write)
		}
	}
	put := func(n, ts *big.Rat) {
		m.buckets[p.Key] = &modelBucket{n, ts}
		if blocky {
			m.setBlocks(p.Key, live)
		}
	}
	d := ModelDecision{Burst: l.burst, Cost: cost}
	if op == bucket.Refund {
		n := minRat(new(big.Rat).Add(tokens, cost), l.burst)
		d.Allowed, d.Tokens, d.RetryNs = true, n, new(big.Rat)
		d.ResetNs = l.until(n, ts, l.burst, now)
		if write {
			put(n, ts)
		}
		return d
	}
	debt := new(big.Rat).Sub(cost, tokens)
	canReserve := p.Reserve && (l.maxReserved == nil || debt.Cmp(l.maxReserved) <= 0)
	allowed := tokens.Cmp(cost) >= 0
	if follow != nil && !canReserve && new(big.Rat).Abs(debt).Cmp(tol) <= 0 {
		allowed = follow.Allowed // at the boundary, within tolerance
	}
	switch {
	case allowed:
		n := new(big.Rat).Sub(tokens, cost)
		d.Allowed, d.Tokens, d.RetryNs = true, n, new(big.Rat)
		if n.Sign() < 0 { // tolerance case: the store rounded the other way
			n = new(big.Rat)
			d.Tokens = n
		}
		d.ResetNs = l.until(n, ts, l.burst, now)
		if write && op == bucket.Take {
			put(n, ts)
		}
	case canReserve:
		n := new(big.Rat).Sub(tokens, cost)
		d.Allowed, d.Tokens = true, n
		d.RetryNs = l.until(n, ts, new(big.Rat), now)
		d.ResetNs = l.until(n, ts, l.burst, now)
		if write && op == bucket.Take {
			put(n, ts)
		}
	default:
		d.Tokens = tokens
		need := cost // a bounded reservation passes once the debt fits
		if p.Reserve && l.maxReserved != nil {
			need = new(big.Rat).Sub(cost, l.maxReserved)
		}
		d.RetryNs = l.until(tokens, ts, need, now)
		d.ResetNs = l.until(tokens, ts, l.burst, now)
	}
	return d
}

// Reset forgets key.
func (m *Model) Reset(key string) {
	delete(m.buckets, key)
	delete(m.logs, key)
	delete(m.counts, key)
	delete(m.blocks, key)
}

// Prepare is the model's own reading of a request: the errors docs/semantics.md
// names for op and cost, decided in exact arithmetic (the limit itself is
// validated and resolved by drip.Limit.Params, which the model does not
// re-derive). A take or peek whose cost exceeds the burst is an error
// unless reserved, and a reservation whose cost exceeds the burst plus a
// bound on the debt is an error too (it could never fit); a refund takes
// any finite cost >= 0.
func (m *Model) Prepare(op bucket.Op, r drip.Request) (bucket.Prepared, error) {
	if r.Key == "" {
		return bucket.Prepared{}, store.ErrMissingKey
	}
	p, err := r.Limit.Params(r.Key)
	if err != nil {
		return bucket.Prepared{}, err
	}
	if op != bucket.Take && op != bucket.Peek && op != bucket.Refund {
		return bucket.Prepared{}, store.ErrInvalidOp
	}
	if math.IsNaN(r.Cost) || math.IsInf(r.Cost, 0) || r.Cost < 0 || r.Cost > 1e12 {
		return bucket.Prepared{}, store.ErrInvalidCost
	}
	if (p.Kind == bucket.Sliding || r.Limit.Calendar != "") && r.Reserve {
		return bucket.Prepared{}, store.ErrInvalidCost // no reservations on sliding or calendar windows
	}
	if r.Limit.Calendar != "" {
		m.calendars[r.Key] = r.Limit
	} else {
		delete(m.calendars, r.Key)
	}
	if p.Kind == bucket.Sliding {
		p.Start = m.grid
	}
	micro := int64(math.Round(r.Cost * bucket.Micro))
	l := modelLimit(p)
	over := new(big.Rat).Sub(big.NewRat(micro, bucket.Micro), l.burst) // cost - burst
	if op != bucket.Refund && over.Sign() > 0 {
		if !r.Reserve || (l.maxReserved != nil && over.Cmp(l.maxReserved) > 0) {
			return bucket.Prepared{}, drip.ErrCostExceedsBurst
		}
	}
	return bucket.Prepared{Key: r.Key, Params: p, Cost: micro, Reserve: r.Reserve}, nil
}

// PrepareMulti is Prepare for a multi-take: the first bad request's error,
// or a key that appears twice.
func (m *Model) PrepareMulti(op bucket.Op, rs []drip.Request) ([]bucket.Prepared, error) {
	if len(rs) == 0 {
		return nil, store.ErrNoRequests
	}
	ps := make([]bucket.Prepared, len(rs))
	seen := map[string]bool{}
	for i, r := range rs {
		p, err := m.Prepare(op, r)
		if err != nil {
			return nil, err
		}
		if seen[r.Key] {
			return nil, store.ErrDuplicateKey
		}
		seen[r.Key] = true
		ps[i] = p
	}
	return ps, nil
}
