package storetest

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/driplimit/drip"
	"github.com/driplimit/drip/bucket"
	"github.com/driplimit/drip/replay"
	"github.com/driplimit/drip/store"
)

// slidingLimits are the sliding windows random window traces draw from:
// one slot and many, slots that divide the window and slots that do not.
var slidingLimits = []drip.Limit{
	{Algorithm: drip.SlidingWindow, Rate: 5, Period: 2 * s},
	{Algorithm: drip.SlidingWindow, Rate: 3, Period: 10 * s, Slots: 4},
	{Algorithm: drip.SlidingWindow, Rate: 2.5, Period: 700 * ms, Slots: 1},
	{Algorithm: drip.SlidingWindow, Rate: 10, Period: time.Minute, Slots: 60},
	{Algorithm: drip.SlidingWindow, Rate: 4, Period: 3 * s, Slots: 7},
}

// RandomWindowLines returns a random trace of n lines on sliding windows
// (keys a to c), with a token bucket (key d) in some multi-takes,
// reproducible from seed: takes, peeks, refunds, resets, costs over the
// limit and reservations (errors), and a clock that sometimes goes back.
func RandomWindowLines(seed uint64, n int) []replay.Line {
	rng := rand.New(rand.NewPCG(seed, seed^0x5851f42d4c957f2d))
	keys := []string{"a", "b", "c", "d"}
	lim := map[string]drip.Limit{"d": {Rate: 2, Burst: 3}}
	for _, k := range keys[:3] {
		lim[k] = slidingLimits[rng.IntN(len(slidingLimits))]
	}
	steps := []time.Duration{0, 1 * ms, 50 * ms, 100 * ms, 250 * ms, 333 * ms, 1 * s, 2500 * ms, 7 * s}
	costs := []float64{0, 0.5, 1, 1, 1, 2}
	req := func(k string) drip.Request {
		l := lim[k]
		r := drip.Request{Key: k, Limit: l, Cost: costs[rng.IntN(len(costs))]}
		switch rng.IntN(16) {
		case 0:
			r.Cost = l.Rate
		case 1:
			r.Cost = l.Rate + 1 // over the limit: an error
		case 2:
			r.Reserve = true // no reservations on a sliding window: an error
		}
		return r
	}
	var at time.Duration = 10 * s
	lines := make([]replay.Line, 0, n)
	for range n {
		if rng.IntN(25) == 0 {
			at -= []time.Duration{1 * ms, 300 * ms, 2 * s}[rng.IntN(3)]
		} else {
			at += steps[rng.IntN(len(steps))]
		}
		lines = append(lines, windowLine(rng, at, keys, req))
	}
	return lines
}

// RunWindows holds a store to the sliding window's model, line by line
// over random traces, when it holds sliding windows (Caps.Sliding); a
// store that does not must refuse them with store.ErrUnsupported.
func RunWindows(t *testing.T, newStore NewStore, seeds, n int) {
	st := newStore(t)
	if !st.Caps().Sliding {
		_, err := Apply(ctx(t), st, bucket.Take, base(), drip.Request{Key: prefix() + "w", Limit: slidingLimits[0], Cost: 1})
		if !errors.Is(err, store.ErrUnsupported) {
			t.Fatalf("a store without Caps.Sliding took a sliding window: err = %v, want ErrUnsupported", err)
		}
		return
	}
	for seed := range seeds {
		t.Run(fmt.Sprint("seed", seed), func(t *testing.T) {
			CompareWithModel(t, newStore(t), RandomWindowLines(uint64(seed), n))
		})
	}
}

// windowLine is a random line of a window trace at at: a take, peek or
// refund on one of the first three keys, a reset, or a multi-take of two
// or three keys, each request made by req.
func windowLine(rng *rand.Rand, at time.Duration, keys []string, req func(string) drip.Request) replay.Line {
	l := replay.Line{At: at}
	switch x := rng.IntN(100); {
	case x < 55:
		l.Op, l.Request = "take", req(keys[rng.IntN(3)])
	case x < 70:
		l.Op, l.Request = "peek", req(keys[rng.IntN(3)])
	case x < 80:
		l.Op, l.Request = "refund", req(keys[rng.IntN(3)])
	case x < 83:
		l.Op, l.Request = "reset", drip.Request{Key: keys[rng.IntN(3)]}
	default:
		l.Op = "take"
		for _, i := range rng.Perm(len(keys))[:2+rng.IntN(2)] {
			l.Requests = append(l.Requests, req(keys[i]))
		}
	}
	return l
}
