package bucket

import (
	"math"
	"time"
)

// This file is the math of a sliding window limit: at most Limit
// micro-tokens taken in any rolling window of Window nanoseconds. It is
// exact in the direction that matters, within bounded memory:
//
// Time is cut into slots of Slot = ceil(Window/Slots) nanoseconds on a grid
// Start nanoseconds past the epoch's (0 for every limit of package drip;
// drip replay moves it, see SlidingParams.Start), and a key keeps one count
// per slot for the last Slots+1 slots. A take is allowed when the counts of
// those slots, added to its cost, stay within Limit. Any interval of Window
// nanoseconds lies within Slots+1 consecutive slots, and the last take
// allowed in it counted all of them, so no interval of Window ever holds
// more than Limit: never over-admission. The price is early denials: what a
// take counts reaches back between Window and Window+Slot (the oldest slot
// is counted whole), so a take may be refused while the exact rolling count
// is below Limit by at most what was taken in the oldest slot's part that
// is older than Window. With 10 slots, that is at most a tenth of the
// window's length of history. A weighted two-window counter (the previous
// window's count scaled by how much of it still overlaps) keeps two counts
// instead, but it assumes the previous window's takes were spread evenly
// and can admit more than the limit in a rolling window; drip does not.

// Sliding is the kind of a sliding window limit: Burst (and Rate, so
// that a divided limit stays whole) is the limit in micro-tokens, Period
// the window in nanoseconds, Parts the slots the window is cut into, Start
// the offset of the slot grid from the epoch's (taken modulo the slot).
// MaxReserved is unused. Its state is a SlidingState.
const Sliding Kind = 4

// DefaultSlots is how many slots a sliding window has unless its limit
// says otherwise.
const DefaultSlots = 10

// Sliding is the SlidingParams of a limit of Kind Sliding.
func (p Params) Sliding() SlidingParams {
	sp := SlidingParams{Limit: p.Burst, Window: p.Period, Slots: int(p.Parts)}
	if p.Start != 0 && sp.Slots > 0 {
		sp.Start = floorMod(p.Start, sp.Slot())
	}
	return sp
}

// SlidingParams is a sliding window limit in fixed point.
type SlidingParams struct {
	Limit  int64 // micro-tokens in any rolling window
	Window int64 // nanoseconds
	Slots  int   // counts kept: Slots+1; 1 to MaxSlots
	// Start is the offset of the slot grid from the epoch's, from 0 to
	// Slot-1: slot j holds the instants from j*Slot+Start (included) to
	// (j+1)*Slot+Start. drip.Limit leaves it 0; drip replay sets it so
	// that a trace's slots are counted from its own time 0, whenever it
	// runs.
	Start int64
}

// MaxSlots bounds the counts a key keeps.
const MaxSlots = 1000

// Slot is the length of one slot, in nanoseconds.
func (p SlidingParams) Slot() int64 { return ceilDiv(p.Window, int64(p.Slots)) }

// SlidingState is the stored state of one key: Counts[i] is what was taken
// in slot Last-Slots+i (Slots+1 counts, the last one the newest).
type SlidingState struct {
	Last   int64
	Counts []int64
}

// shift moves s to slot j: counts of slots before j-Slots are dropped. A
// clock that went back (j before s.Last) moves nothing: the decision is
// taken as in slot s.Last, so no count is ever dropped early.
func (p SlidingParams) shift(s SlidingState, found bool, j int64) SlidingState {
	n := p.Slots + 1
	counts := make([]int64, n)
	if found && len(s.Counts) == n {
		if j < s.Last {
			j = s.Last
		}
		if d := j - s.Last; d < int64(n) {
			copy(counts, s.Counts[d:])
		}
	}
	return SlidingState{Last: j, Counts: counts}
}

// SlidingExpiresAt is the instant from which the stored state s carries
// no information (every count has left the window), so that a store may
// drop it: stores set their TTLs from it.
func (p SlidingParams) SlidingExpiresAt(s SlidingState) int64 {
	return p.boundary(s.Last + int64(p.Slots) + 1)
}

// slotOf is the slot that holds instant t: floor((t-Start)/Slot), without
// computing t-Start, which overflows before 1970 (down to 1677) when
// Start is large.
func (p SlidingParams) slotOf(t int64) int64 {
	slot := p.Slot()
	j := floorDiv(t, slot)
	if floorMod(t, slot) < p.Start {
		j--
	}
	return j
}

// boundary is the instant slot k begins, k*Slot+Start, saturating at
// MaxInt64: with slots of months or years, a slot may begin after the
// last instant of int64 nanoseconds (in 2262), and its waits then end at
// that instant, as a bucket's do (Params.reach). No slot a decision names
// begins before MinInt64 (k is past the slot of some int64 instant), but
// k*Slot alone may lie below it: a slot before 0 is computed from the
// next one's start, which cannot.
func (p SlidingParams) boundary(k int64) int64 {
	slot := p.Slot()
	switch {
	case k > (math.MaxInt64-p.Start)/slot:
		return math.MaxInt64
	case k < 0:
		return (k+1)*slot - (slot - p.Start)
	}
	return k*slot + p.Start
}

// EvalSliding decides op (take, peek or refund) of cost micro-tokens at
// now under p, from state s (found false for a key without one), and
// returns the result and the state to store (write false when nothing
// changed). A refund gives back from the newest slot first, never below
// zero. A cost above Limit can never be taken: the caller refuses it first,
// as it does a cost above a bucket's burst; reservations do not apply.
func EvalSliding(op Op, s SlidingState, found bool, p SlidingParams, cost, now int64) (Result, SlidingState, bool) {
	j := p.slotOf(now)
	s = p.shift(s, found, j)
	var used int64
	for _, c := range s.Counts {
		used += c
	}
	switch op {
	case Refund:
		for i := len(s.Counts) - 1; i >= 0 && cost > 0; i-- {
			give := min(cost, s.Counts[i])
			s.Counts[i] -= give
			used -= give
			cost -= give
		}
		return p.result(true, s, used, 0, now), s, true
	case Take, Peek:
		if used+cost > p.Limit {
			// The slots that must leave the count, oldest first: slot i
			// (of the counts) leaves when the current slot is past
			// Last-Slots+i by Slots, at boundary(Last+i+1).
			need, retry := used+cost-p.Limit, int64(0)
			for i, c := range s.Counts {
				need -= c
				if need <= 0 {
					retry = int64(untilAt(p.boundary(s.Last+int64(i)+1), now))
					break
				}
			}
			return p.result(false, s, used, time.Duration(retry), now), s, false
		}
		// A peek answers as the take would (s is shift's copy), and
		// writes nothing.
		s.Counts[len(s.Counts)-1] += cost
		used += cost
		return p.result(true, s, used, 0, now), s, op == Take
	}
	return Result{}, s, false
}

// result is a decision on s: Tokens is what may still be taken now, and
// ResetAfter when every count has left (all of Limit may be taken again).
func (p SlidingParams) result(allowed bool, s SlidingState, used int64, retry time.Duration, now int64) Result {
	var reset int64
	for i := len(s.Counts) - 1; i >= 0; i-- {
		if s.Counts[i] > 0 {
			reset = int64(untilAt(p.boundary(s.Last+int64(i)+1), now))
			break
		}
	}
	return Result{Allowed: allowed, Tokens: p.Limit - used, RetryAfter: retry, ResetAfter: time.Duration(reset)}
}

// floorDiv is a/b rounded down, for b > 0.
func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && a < 0 {
		q--
	}
	return q
}
