package bucket

import (
	"math"
	"math/big"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// entry is one take of the log the reference keeps.
type entry struct{ at, cost int64 }

// slidingLog is the reference: every take kept, each decision counted from
// the log. A take at now is allowed when what was taken since the start of
// slot j-Slots (j the slot of now), plus its cost, is within the limit.
type slidingLog struct {
	p   SlidingParams
	log []entry
}

func (l *slidingLog) since(now int64) int64 {
	slot := l.p.Slot()
	j := now / slot
	return (j - int64(l.p.Slots)) * slot
}

func (l *slidingLog) used(now int64) int64 {
	from, n := l.since(now), int64(0)
	for _, e := range l.log {
		if e.at >= from {
			n += e.cost
		}
	}
	return n
}

func (l *slidingLog) decide(op Op, cost, now int64) Result {
	slot := l.p.Slot()
	used := l.used(now)
	res := Result{Allowed: true}
	switch op {
	case Refund:
		from := l.since(now)
		for i := len(l.log) - 1; i >= 0 && cost > 0 && l.log[i].at >= from; i-- {
			g := min(cost, l.log[i].cost)
			l.log[i].cost -= g
			cost -= g
			used -= g
		}
	case Take, Peek:
		if used+cost > l.p.Limit {
			// Wait, slot by slot, until enough has left the count.
			res.Allowed = false
			for t := (now/slot + 1) * slot; ; t += slot {
				if l.used(t)+cost <= l.p.Limit {
					res.RetryAfter = time.Duration(t - now)
					break
				}
			}
		} else {
			// A peek answers as the take would: with its cost logged,
			// and the log put back after.
			l.log = append(l.log, entry{now, cost})
			used += cost
			if op == Peek {
				defer func() { l.log = l.log[:len(l.log)-1] }()
			}
		}
	}
	res.Tokens = l.p.Limit - used
	// Reset: the first slot start from which nothing taken is counted.
	for t := now; ; t = (t/slot + 1) * slot {
		if l.used(t) == 0 {
			res.ResetAfter = time.Duration(t - now)
			break
		}
	}
	return res
}

// Random traces against the log, and the guarantee on every trace: no
// window of Window nanoseconds holds more than Limit taken.
func TestSlidingAgainstTheLog(t *testing.T) {
	r := rand.New(rand.NewPCG(2, 28))
	for trace := range 300 {
		p := SlidingParams{
			Limit:  (1 + r.Int64N(20)) * Micro,
			Window: 1 + r.Int64N(int64(10*time.Second)),
			Slots:  1 + r.IntN(12),
		}
		ref := &slidingLog{p: p}
		var s SlidingState
		found := false
		now := r.Int64N(int64(time.Hour))
		refunds := r.IntN(2) == 0
		for step := range 200 {
			now += r.Int64N(p.Window/4 + 1)
			op := Take
			switch x := r.IntN(10); {
			case x == 0:
				op = Peek
			case x == 1 && refunds:
				op = Refund
			}
			cost := r.Int64N(p.Limit/3+1) + 1
			got, next, write := EvalSliding(op, s, found, p, cost, now)
			want := ref.decide(op, cost, now)
			if got != want {
				t.Fatalf("trace %d step %d: %v of %d at %d under %+v: %+v, the log says %+v", trace, step, op, cost, now, p, got, want)
			}
			if write {
				s, found = next, true
			}
		}
		if refunds {
			continue
		}
		for i, e := range ref.log {
			var n int64
			for _, f := range ref.log[:i+1] {
				if f.at > e.at-p.Window {
					n += f.cost
				}
			}
			if n > p.Limit {
				t.Fatalf("trace %d: %d taken in the window of %d ns ending at %d, limit %d", trace, n, p.Window, e.at, p.Limit)
			}
		}
	}
}

// Early denials are bounded: a denied take would have overflowed a window
// at most one slot longer than Window.
func TestSlidingDenialsReachBackOneSlot(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 28))
	for range 200 {
		p := SlidingParams{Limit: 10 * Micro, Window: int64(time.Second), Slots: 1 + r.IntN(10)}
		var s SlidingState
		found := false
		var log []entry
		now := int64(0)
		for range 300 {
			now += r.Int64N(int64(50 * time.Millisecond))
			cost := (1 + r.Int64N(3)) * Micro
			res, next, write := EvalSliding(Take, s, found, p, cost, now)
			if write {
				s, found = next, true
			}
			if res.Allowed {
				log = append(log, entry{now, cost})
				continue
			}
			var n int64
			for _, e := range log {
				if e.at > now-p.Window-p.Slot() {
					n += e.cost
				}
			}
			if n+cost <= p.Limit {
				t.Fatalf("a take of %d at %d denied with %d taken in the last window and slot (%+v)", cost, now, n, p)
			}
		}
	}
}

// TestSlidingStart holds a grid moved by Start to the grid of the epoch
// moved by as much: the same steps, each at its time plus d, decided with
// Start d (modulo the slot), give the same results and states as at their
// own times with Start 0 (the slot numbers moved by the whole slots in
// d), for slots that divide d and slots that do not.
func TestSlidingStart(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for _, ps := range []Params{
		{Kind: Sliding, Burst: 5 * Micro, Rate: 5 * Micro, Period: int64(time.Second), Parts: 7},
		{Kind: Sliding, Burst: 3 * Micro, Rate: 3 * Micro, Period: int64(10 * time.Second), Parts: 4},
		{Kind: Sliding, Burst: 2 * Micro, Rate: 2 * Micro, Period: int64(700 * time.Millisecond), Parts: 1},
	} {
		for _, d := range []int64{1, int64(time.Second), 1_764_370_800_123_456_789} {
			moved := ps
			moved.Start = d
			p0, pd := ps.Sliding(), moved.Sliding()
			k := d / p0.Slot() // whole slots between the grids
			if pd.Start < 0 || pd.Start >= pd.Slot() {
				t.Fatalf("Start %d of slot %d: %d, want it modulo the slot", d, pd.Slot(), pd.Start)
			}
			var s0, sd SlidingState
			found := false
			now := int64(0)
			for i := range 300 {
				now += rng.Int64N(int64(400 * time.Millisecond))
				op := []Op{Take, Take, Peek, Refund}[rng.IntN(4)]
				cost := rng.Int64N(3) * Micro
				r0, n0, w0 := EvalSliding(op, s0, found, p0, cost, now)
				rd, nd, wd := EvalSliding(op, sd, found, pd, cost, now+d)
				if r0 != rd || w0 != wd || n0.Last+k != nd.Last || !slices.Equal(n0.Counts, nd.Counts) {
					t.Fatalf("%+v moved by %d, step %d (%v of %d at %d): %+v %+v, want %+v %+v", ps, d, i, op, cost, now, rd, nd, r0, n0)
				}
				if e0, ed := p0.SlidingExpiresAt(n0), pd.SlidingExpiresAt(nd); ed != e0+d {
					t.Fatalf("%+v moved by %d: expires at %d, want %d", ps, d, ed, e0+d)
				}
				if w0 {
					s0, sd, found = n0, nd, true
				}
			}
		}
	}
}

// Slots of months or years: a slot may begin after the last instant of
// int64 nanoseconds (in 2262). Waits then end at that instant, as a
// bucket's do, and are never negative; the state expires there too. The
// same holds on a grid moved by Start (as drip replay moves it) and at
// both ends of int64 time, where now-Start and k*Slot alone lie outside
// int64 though the instants asked for do not.
func TestSlidingLongSlots(t *testing.T) {
	const last = math.MaxInt64
	for _, p := range []SlidingParams{
		{Limit: 5 * Micro, Window: int64(8760 * time.Hour), Slots: 1},
		{Limit: 5 * Micro, Window: int64(2_000_000 * time.Hour), Slots: 1},
		{Limit: 5 * Micro, Window: int64(2_562_047 * time.Hour), Slots: 10},
		{Limit: 5 * Micro, Window: last, Slots: 1},
		{Limit: 5 * Micro, Window: last, Slots: MaxSlots},
		{Limit: 5 * Micro, Window: int64(time.Second), Slots: 7},
	} {
		for _, start := range []int64{0, 1, p.Slot() / 2, p.Slot() - 1} {
			for _, now := range []int64{
				1_795_907_804_066_170_719, // 2026-11-28
				math.MinInt64, math.MinInt64 + 1, -1 << 62, 0, last - 1,
			} {
				p.Start = start
				s := SlidingState{}
				found := false
				for range 5 {
					r, next, write := EvalSliding(Take, s, found, p, Micro, now)
					if !r.Allowed || !write {
						t.Fatalf("%+v at %d: a take within the limit denied: %+v", p, now, r)
					}
					s, found = next, true
				}
				r, _, _ := EvalSliding(Take, s, found, p, Micro, now)
				// now lies in slot j = floor((now-Start)/Slot), and the
				// newest count leaves when slot j+Slots+1 begins.
				slot := big.NewInt(p.Slot())
				j := new(big.Int).Sub(big.NewInt(now), big.NewInt(start))
				j.Div(j.Sub(j, new(big.Int).Mod(j, slot)), slot)
				if !j.IsInt64() || s.Last != j.Int64() {
					t.Fatalf("%+v at %d: slot %d, want %v", p, now, s.Last, j)
				}
				end := new(big.Int).Add(j, big.NewInt(int64(p.Slots)+1))
				end.Add(end.Mul(end, slot), big.NewInt(start))
				if end.Cmp(big.NewInt(last)) > 0 {
					end.SetInt64(last)
				}
				wait := new(big.Int).Sub(end, big.NewInt(now))
				want := time.Duration(last)
				if wait.IsInt64() {
					want = time.Duration(wait.Int64())
				}
				if r.Allowed || r.RetryAfter != want || r.ResetAfter != want {
					t.Errorf("%+v at %d: over the limit: %+v, want denied with both waits %v", p, now, r, want)
				}
				if got := p.SlidingExpiresAt(s); got != end.Int64() {
					t.Errorf("%+v at %d: expires at %d, want %v", p, now, got, end)
				}
			}
		}
	}
}
