package storetest

import (
	"fmt"
	"math"
	"math/big"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/driplimit/drip"
	"github.com/driplimit/drip/bucket"
	"github.com/driplimit/drip/replay"
	"github.com/driplimit/drip/store"
)

// randomLimits are the limits random traces draw from: exact and inexact
// rates, every refill, reservations with and without a bound.
var randomLimits = []drip.Limit{
	{Rate: 10, Burst: 20},
	{Rate: 7, Period: 3 * s, Burst: 5},
	{Rate: 0.5, Burst: 2},
	{Rate: 1000, Burst: 100},
	{Rate: 2, Burst: 4, MaxReserved: 3},
	{Rate: 4, Burst: 1, MaxReserved: 3},
	{Rate: 5, Period: 10 * s, Burst: 20, Refill: drip.Interval},
	{Rate: 3, Period: 700 * ms, Burst: 4, Refill: drip.Interval},
	{Algorithm: drip.FixedWindow, Rate: 3, Period: time.Minute, Burst: 5, Start: time.Minute},
	{Algorithm: drip.FixedWindow, Rate: 2, Period: 7 * s},
}

// RandomLines returns a random trace of n lines in the replay format (as
// parsed lines), reproducible from seed.
func RandomLines(seed uint64, n int) []replay.Line {
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	keys := []string{"a", "b", "c", "d"}
	lim := map[string]drip.Limit{}
	bounded := false
	for _, k := range keys {
		lim[k] = randomLimits[rng.IntN(len(randomLimits))]
		bounded = bounded || lim[k].MaxReserved > 0
	}
	if !bounded {
		// A bound on reservations, so that some can never fit.
		lim["d"] = drip.Limit{Rate: 4, Burst: 1, MaxReserved: 3}
	}
	steps := []time.Duration{0, 0, 1 * ms, 7 * ms, 50 * ms, 100 * ms, 333 * ms, 1 * s, 2500 * ms, 12 * s}
	costs := []float64{0, 0.5, 1, 1, 1, 2, 3.25}
	var at time.Duration = 10 * s
	req := func(k string) drip.Request {
		l := lim[k]
		r := drip.Request{Key: k, Limit: l, Cost: costs[rng.IntN(len(costs))], Reserve: rng.IntN(6) == 0}
		switch rng.IntN(12) {
		case 0:
			r.Cost = limBurst(l)
		case 1:
			r.Cost = limBurst(l) + 1 // over the burst: an error unless reserved
		case 2:
			// Over the burst and any bound on the debt: a reservation that
			// can never fit (an error) when the limit bounds its debt, and a
			// refund above the burst.
			r.Cost = limBurst(l) + l.MaxReserved + 2
			r.Reserve = rng.IntN(4) != 0
		}
		return r
	}
	lines := make([]replay.Line, 0, n)
	for range n {
		if rng.IntN(20) == 0 {
			at -= []time.Duration{1 * ms, 200 * ms, 3 * s}[rng.IntN(3)]
		} else {
			at += steps[rng.IntN(len(steps))]
		}
		l := replay.Line{At: at}
		switch x := rng.IntN(100); {
		case x < 55:
			l.Op, l.Request = "take", req(keys[rng.IntN(len(keys))])
		case x < 70:
			l.Op, l.Request = "peek", req(keys[rng.IntN(len(keys))])
		case x < 78:
			l.Op, l.Request = "refund", req(keys[rng.IntN(len(keys))])
		case x < 82:
			l.Op, l.Request = "reset", drip.Request{Key: keys[rng.IntN(len(keys))]}
		default:
			l.Op = "take"
			perm := rng.Perm(len(keys))
			for _, i := range perm[:2+rng.IntN(2)] {
				l.Requests = append(l.Requests, req(keys[i]))
			}
		}
		lines = append(lines, l)
	}
	return lines
}

// RunRandom runs a random trace of n operations on the store and on the
// exact Model, and compares every decision.
func RunRandom(t *testing.T, newStore NewStore, seeds, n int) {
	for seed := range seeds {
		t.Run(fmt.Sprint("seed", seed), func(t *testing.T) {
			st := newStore(t)
			CompareWithModel(t, st, RandomLines(uint64(seed), n))
		})
	}
}

// Tolerance is how far, in tokens, a store may be from exact arithmetic
// over a random trace of up to a thousand decisions: 1e-5 token. drip's
// fixed point loses at most min(1, Rate/Period in micro-tokens per ns)
// micro-tokens per decision that refills without filling (see math.go),
// never over-grants, and is exact at every representable boundary; the
// random limits refill well under a micro-token per nanosecond.
var Tolerance = big.NewRat(1, 100000)

// CompareWithModel runs lines on the store and on a fresh Model and fails
// on any disagreement beyond Tolerance.
func CompareWithModel(t *testing.T, st store.Store, lines []replay.Line) {
	t.Helper()
	compareFrom(t, st, base(), 0, lines)
}

// compareFrom is CompareWithModel with the lines' times counted from b,
// and every sliding window's slot grid moved by grid from the epoch's, on
// the store (gridMoved) and in the model alike.
func compareFrom(t *testing.T, st store.Store, b time.Time, grid int64, lines []replay.Line) {
	t.Helper()
	c := ctx(t)
	p := prefix()
	m := NewModel()
	if grid != 0 {
		st, m.grid = gridMoved{st, grid}, grid
	}
	for i, l := range lines {
		at := b.Add(l.At)
		where := fmt.Sprintf("line %d (%s at %v)", i, l.Op, l.At)
		if l.Op == "reset" {
			if err := st.Reset(c, p+l.Request.Key); err != nil {
				t.Fatalf("%s: %v", where, err)
			}
			m.Reset(p + l.Request.Key)
			continue
		}
		op, _ := replay.Op(l.Op)
		rs := l.Requests
		if rs == nil {
			rs = []drip.Request{l.Request}
		}
		own := make([]drip.Request, len(rs))
		for j, r := range rs {
			r.Key = p + r.Key
			own[j] = r
		}
		var got []drip.Decision
		var err error
		allowed := false
		if l.Requests == nil {
			var d drip.Decision
			d, err = Apply(c, st, op, at, own[0])
			got, allowed = []drip.Decision{d}, d.Allowed
		} else {
			var mm drip.Multi
			mm, err = drip.Apply(c, st, op, at, own...)
			got, allowed = mm.Decisions, mm.Allowed
		}
		if msg := m.step(op, own, l.Requests != nil, at, got, allowed, err); msg != "" {
			t.Fatalf("%s: %s", where, msg)
		}
	}
}

// step checks one line's outcome (the store's decisions, or its error)
// against the exact model, and advances the model. It returns what is
// wrong, or "".
func (m *Model) step(op bucket.Op, rs []drip.Request, multi bool, at time.Time, got []drip.Decision, allowed bool, err error) string {
	var ps []bucket.Prepared
	var perr error
	if multi {
		ps, perr = m.PrepareMulti(op, rs)
	} else {
		var p bucket.Prepared
		p, perr = m.Prepare(op, rs[0])
		ps = []bucket.Prepared{p}
	}
	if perr != nil {
		if err == nil || !strings.Contains(err.Error(), perr.Error()) {
			return fmt.Sprintf("store err = %v, exact model says %v", err, perr)
		}
		return ""
	}
	if err != nil {
		return err.Error()
	}
	if len(got) != len(ps) {
		return fmt.Sprintf("%d decisions for %d requests", len(got), len(ps))
	}
	if multi && allowed != allAllowed(got) {
		return fmt.Sprintf("Multi.Allowed %v but decisions %+v", allowed, got)
	}
	// The model decides each request, following the store only at a
	// boundary within tolerance; then applies all or none.
	want := make([]ModelDecision, len(ps))
	for j, pr := range ps {
		want[j] = m.Apply(op, pr, at, false, &got[j], Tolerance)
	}
	all := true
	for _, w := range want {
		all = all && w.Allowed
	}
	if op == bucket.Refund || (op == bucket.Take && (all || len(ps) == 1)) {
		for j, pr := range ps {
			if want[j].Allowed || op == bucket.Refund {
				m.Apply(op, pr, at, true, &got[j], Tolerance)
			}
		}
	}
	for j := range ps {
		if msg := compare(got[j], want[j], ps[j].Params, at); msg != "" {
			return fmt.Sprintf("request %d (%s cost %v reserve %v, limit %v): %s", j, rs[j].Key, rs[j].Cost, rs[j].Reserve, rs[j].Limit, msg)
		}
	}
	return ""
}

func allAllowed(ds []drip.Decision) bool {
	for _, d := range ds {
		if !d.Allowed {
			return false
		}
	}
	return true
}

// compare checks a store's decision at at against the exact one.
func compare(got drip.Decision, want ModelDecision, p bucket.Params, at time.Time) string {
	tol, _ := Tolerance.Float64()
	wt, _ := want.Tokens.Float64()
	// How long tol tokens take to refill, plus a microsecond of slack.
	ttol := time.Duration(min(tol*float64(p.Period)/(float64(p.Rate)/bucket.Micro), 1<<62)) + time.Microsecond
	if p.Kind != bucket.Continuous {
		ttol = time.Microsecond
	}
	retry, reset := Reported(at, want.RetryNs), Reported(at, want.ResetNs)
	switch {
	case got.Allowed != want.Allowed:
		return fmt.Sprintf("allowed %v, exact model says %v (got %+v, exact tokens %v)", got.Allowed, want.Allowed, got, wt)
	case math.Abs(got.Tokens-wt) > tol:
		return fmt.Sprintf("tokens %v, exact %v", got.Tokens, wt)
	case got.Remaining != int64(math.Floor(math.Max(0, got.Tokens))):
		return fmt.Sprintf("remaining %v for tokens %v", got.Remaining, got.Tokens)
	case got.Burst != float64(p.Burst)/bucket.Micro:
		return fmt.Sprintf("limit %v, want %v", got.Burst, float64(p.Burst)/bucket.Micro)
	case absDur(got.RetryAfter-retry) > ttol:
		return fmt.Sprintf("retry_after %v, exact %v", got.RetryAfter, retry)
	case absDur(got.ResetAfter-reset) > ttol:
		return fmt.Sprintf("reset_after %v, exact %v", got.ResetAfter, reset)
	}
	return ""
}

// Reported is how a store reports an exact wait of ns nanoseconds from
// at (docs/semantics.md): rounded to the nanosecond, ending no later
// than the last instant of int64 nanoseconds (in 2262), and no longer
// than the largest time.Duration.
func Reported(at time.Time, ns *big.Rat) time.Duration {
	now := big.NewInt(at.UnixNano())
	end := new(big.Int).Add(now, roundRat(ns))
	if last := big.NewInt(math.MaxInt64); end.Cmp(last) > 0 {
		end = last
	}
	d := end.Sub(end, now)
	if !d.IsInt64() {
		return time.Duration(math.MaxInt64)
	}
	return time.Duration(max(0, d.Int64()))
}

// roundRat is r rounded to the nearest integer (halves away from zero,
// as math.Round), for r >= 0.
func roundRat(r *big.Rat) *big.Int {
	return floorRat(new(big.Rat).Add(r, big.NewRat(1, 2)))
}

func absDur(d time.Duration) time.Duration {
	if d < 0 {
		return -d
	}
	return d
}
