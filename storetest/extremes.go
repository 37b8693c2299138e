package storetest

import (
	"context"
	"fmt"
	"math"
	"slices"
	"testing"
	"time"

	"github.com/driplimit/drip"
	"github.com/driplimit/drip/bucket"
	"github.com/driplimit/drip/replay"
	"github.com/driplimit/drip/store"
)

// maxPeriod is the longest period a limit takes: the largest
// time.Duration, about 292 years.
const maxPeriod = time.Duration(math.MaxInt64)

// extremeLimits are limits of every kind at the longest periods drip
// takes, whose waits end past the last instant of int64 nanoseconds (in
// 2262), and whose slots are past 2^53 nanoseconds (where a double stops
// counting them exactly).
func extremeLimits() []drip.Limit {
	berlin, err := time.LoadLocation("Europe/Berlin")
	if err != nil {
		panic(err)
	}
	return []drip.Limit{
		{Algorithm: drip.SlidingWindow, Rate: 5, Period: 8760 * time.Hour, Slots: 1},
		{Algorithm: drip.SlidingWindow, Rate: 5, Period: 2000000 * time.Hour, Slots: 1},
		{Algorithm: drip.SlidingWindow, Rate: 5, Period: 2562047 * time.Hour},
		{Algorithm: drip.SlidingWindow, Rate: 3, Period: maxPeriod, Slots: 1000},
		{Algorithm: drip.SlidingWindow, Rate: 3, Period: maxPeriod, Slots: 1},
		{Algorithm: drip.SlidingWindow, Rate: 2.5, Period: maxPeriod - 1, Slots: 7},
		{Rate: 5, Period: maxPeriod},
		{Rate: 1, Period: maxPeriod, Burst: 3},
		{Rate: 5, Period: maxPeriod, Refill: drip.Interval},
		{Rate: 2, Period: 2562047 * time.Hour, Burst: 4, Refill: drip.Interval, MaxReserved: 1e12},
		{Algorithm: drip.FixedWindow, Rate: 5, Period: maxPeriod, Start: 1},
		{Algorithm: drip.FixedWindow, Rate: 5, Period: maxPeriod, Start: maxPeriod - 1},
		{Algorithm: drip.FixedWindow, Rate: 4, Period: 2000000 * time.Hour},
		{Algorithm: drip.FixedWindow, Rate: 3, Calendar: "month", Location: berlin},
		{Algorithm: drip.FixedWindow, Rate: 3, Calendar: "week"},
		{Algorithm: drip.FixedWindow, Rate: 3, Calendar: "day", Location: berlin},
	}
}

// extremeOrigins are the instants the extreme traces of RunExtremes
// start from: now, 13 hours before a month starts in Berlin, 2116 (2^62
// ns) and near the end of int64 nanoseconds. All lie ahead of the real
// clock, so that no store drops their state by its own clock mid-trace.
// From the second, the traces' clock goes back across the start of a
// day and of a month (ExtremeLines: a take 13h01m after the origin,
// then one an hour before it), whatever the time they run at.
func extremeOrigins() []time.Time {
	berlin, err := time.LoadLocation("Europe/Berlin")
	if err != nil {
		panic(err)
	}
	y, m, _ := time.Now().In(berlin).Date()
	monthStart := time.Date(y, m+2, 1, 0, 0, 0, 0, berlin)
	return []time.Time{base(), monthStart.Add(-13 * time.Hour), time.Unix(0, 1<<62), time.Unix(0, math.MaxInt64-int64(2*time.Hour))}
}

// pastOrigins are those of RunExtremesPast: the epoch, 2^53 ns, 1906 and
// near the start of int64 nanoseconds.
func pastOrigins() []time.Time {
	return []time.Time{time.Unix(0, 0), time.Unix(0, 1<<53), time.Unix(0, -2_000_000_000_000_000_000),
		time.Unix(0, math.MinInt64+int64(2*time.Hour))}
}

// ExtremeLines is a trace on limit l from origin: the limit emptied,
// a denial, a peek, a refund, then takes a slot, half a period and a
// period later (as far as int64 nanoseconds reach), and with the clock
// gone back an hour.
func ExtremeLines(l drip.Limit, origin time.Time) []replay.Line {
	// room is how far after origin a time may lie: up to the instant
	// before the last of int64 nanoseconds, at which a wait that runs past
	// it is reported to end.
	room := maxPeriod
	if o := origin.UnixNano(); o >= 0 {
		room = time.Duration(math.MaxInt64 - 1 - o)
	}
	later := func(at, d time.Duration) time.Duration {
		if d >= room-at {
			return room
		}
		return at + d
	}
	one := drip.Request{Key: "x", Limit: l, Cost: 1}
	all := drip.Request{Key: "x", Limit: l, Cost: l.Rate}
	if l.Burst != 0 {
		all.Cost = l.Burst
	}
	var lines []replay.Line
	add := func(at time.Duration, op string, r drip.Request) {
		lines = append(lines, replay.Line{At: at, Op: op, Request: r})
	}
	period := l.Period
	if l.Calendar != "" {
		period = 24 * time.Hour
	}
	add(0, "take", one)
	add(0, "take", all) // denied: one is taken
	add(1, "peek", one)
	add(1, "refund", one)
	add(2, "take", all)
	add(2, "take", one) // denied
	at := time.Duration(2)
	for _, d := range []time.Duration{time.Millisecond, period / 1000, period / 2, time.Hour, period, period} {
		at = later(at, d)
		add(at, "take", one)
		add(at, "peek", all)
		if at >= 2*time.Hour {
			add(at-time.Hour, "take", one) // the clock went back
		}
		lines = append(lines, replay.Line{At: at, Op: "take", Requests: []drip.Request{
			one, {Key: "y", Limit: drip.PerSecond(1), Cost: 1}}})
	}
	return lines
}

// RunExtremes holds a store to the exact model on limits of every kind
// at the longest periods, from now to the end of int64 nanoseconds: the
// same answers as every other store, with waits that end past the last
// instant reported as ending at it (docs/semantics.md). Kinds the store
// does not hold (Caps) are left out.
func RunExtremes(t *testing.T, newStore NewStore) { runExtremes(t, newStore, extremeOrigins()) }

// RunExtremesPast is RunExtremes from instants before 1970, back to the
// start of int64 nanoseconds. Their states expire in the store's past, so
// it is for a store that keeps them for the length of a test: no sweeper
// (memstore.WithSweep(0), pgstore.WithSweep(0)), or Redis, which keeps
// every key a minute past its expiry.
func RunExtremesPast(t *testing.T, newStore NewStore) { runExtremes(t, newStore, pastOrigins()) }

func runExtremes(t *testing.T, newStore NewStore, origins []time.Time) {
	st := newStore(t)
	caps := st.Caps()
	for i, l := range extremeLimits() {
		if (l.Algorithm == drip.SlidingWindow && !caps.Sliding) || (l.Calendar != "" && !caps.Calendar) {
			continue
		}
		grids := []int64{0}
		if l.Algorithm == drip.SlidingWindow {
			grids = extremeGrids
		}
		for _, o := range origins {
			if l.Algorithm == drip.FixedWindow && l.Calendar == "" && l.Start == 0 && o.UnixNano() < -9e18 {
				// Its grid, placed by the key's hash, may have begun
				// before the first instant of int64 nanoseconds.
				continue
			}
			for _, g := range grids {
				t.Run(fmt.Sprintf("limit%d/%d/grid%d", i, o.UnixNano(), g), func(t *testing.T) {
					compareFrom(t, st, o, g, ExtremeLines(l, o))
				})
			}
		}
	}
}

// extremeGrids are the offsets a sliding window's slot grid is moved by
// in the extreme traces (Params.Start, taken modulo the slot): none; an
// instant of 2025, as drip replay moves a grid to the wall clock (all of
// it for a slot longer); and -1, the last instant of the slot, so that
// now less the offset lies outside int64 near either end.
var extremeGrids = []int64{0, 1_764_370_800_123_456_789, -1}

// gridMoved is a store on which every sliding window's slot grid is moved
// by start from the epoch's (bucket.Params.Start), as drip replay moves
// it; the store decides and expires on that grid.
type gridMoved struct {
	store.Store
	start int64
}

func (g gridMoved) Apply(ctx context.Context, op bucket.Op, at time.Time, items []bucket.Prepared, results []bucket.Result) error {
	own := slices.Clone(items)
	for i := range own {
		if own[i].Params.Kind == bucket.Sliding {
			own[i].Params.Start = g.start
		}
	}
	return g.Store.Apply(ctx, op, at, own, results)
}
