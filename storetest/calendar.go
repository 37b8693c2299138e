package storetest

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/driplimit/drip"
	"github.com/driplimit/drip/bucket"
	"github.com/driplimit/drip/replay"
	"github.com/driplimit/drip/store"
)

// calendarZones are the time zones of the calendar traces: DST of an
// hour at 02:00 (Berlin, New York), of half an hour (Lord Howe), at
// midnight, skipping it in spring and repeating the hour before it in
// autumn (Santiago), none and a half-hour offset (Kolkata), and UTC.
var calendarZones = []string{"Europe/Berlin", "America/New_York", "Australia/Lord_Howe", "America/Santiago", "Asia/Kolkata", "UTC"}

func calendarLimits() []drip.Limit {
	var ls []drip.Limit
	for i, z := range calendarZones {
		loc, err := time.LoadLocation(z)
		if err != nil {
			panic("storetest: time zone " + z + ": " + err.Error())
		}
		for j, unit := range []string{"day", "week", "month"} {
			ls = append(ls, drip.Limit{Algorithm: drip.FixedWindow, Rate: float64(2 + (i+j)%5), Calendar: unit, Location: loc})
		}
	}
	return ls
}

// RandomCalendarLines returns a random trace of n lines on calendar
// windows (keys a to c), with a token bucket (key d) in some multi-takes,
// at times relative to from, reproducible from seed. Its clock only goes
// forward, in small steps and in jumps to just before the boundaries that
// matter: every week's and month's, and the days that are not 24 hours
// long (daylight saving time), over the 400 days after from.
func RandomCalendarLines(seed uint64, n int, from time.Time) []replay.Line {
	rng := rand.New(rand.NewPCG(seed, seed^0x2545f4914f6cdd1d))
	all := calendarLimits()
	keys := []string{"a", "b", "c", "d"}
	lim := map[string]drip.Limit{"d": {Rate: 2, Burst: 3}}
	var marks []time.Time
	for _, k := range keys[:3] {
		l := all[rng.IntN(len(all))]
		lim[k] = l
		for t := from; t.Before(from.Add(400 * 24 * time.Hour)); {
			start, end := calendarWindow(l.Calendar, l.Location, t)
			if l.Calendar != "day" || end.Sub(start) != 24*time.Hour || end.In(l.Location).Day() == 1 {
				marks = append(marks, end)
			}
			t = end
		}
	}
	slices.SortFunc(marks, func(a, b time.Time) int { return a.Compare(b) })
	steps := []time.Duration{0, 1 * ms, 1 * s, 10 * time.Minute, time.Hour, 5 * time.Hour}
	costs := []float64{0, 1, 1, 1, 2}
	req := func(k string) drip.Request {
		l := lim[k]
		r := drip.Request{Key: k, Limit: l, Cost: costs[rng.IntN(len(costs))]}
		switch rng.IntN(16) {
		case 0:
			r.Cost = l.Rate
		case 1:
			r.Cost = l.Rate + 1 // over the limit: an error
		case 2:
			r.Reserve = k != "d" // no reservations on a calendar window: an error
		}
		return r
	}
	at, next := 10*s, 0
	lines := make([]replay.Line, 0, n)
	for range n {
		if rng.IntN(8) == 0 && next < len(marks) {
			// Jump to up to 3 hours before the next boundary.
			to := marks[next].Sub(from) - time.Duration(rng.Int64N(int64(3*time.Hour)))
			at = max(at, to)
			next += 1 + rng.IntN(2)
		} else {
			at += steps[rng.IntN(len(steps))]
		}
		for next < len(marks) && marks[next].Sub(from) <= at {
			next++
		}
		lines = append(lines, windowLine(rng, at, keys, req))
	}
	return lines
}

// RunCalendar holds a store to the calendar window's model, line by line
// over random traces through month ends and daylight saving time changes,
// when it holds calendar windows (Caps.Calendar); a store that does not
// must refuse them with store.ErrUnsupported.
func RunCalendar(t *testing.T, newStore NewStore, seeds, n int) {
	st := newStore(t)
	if !st.Caps().Calendar {
		_, err := Apply(ctx(t), st, bucket.Take, base(), drip.Request{Key: prefix() + "c", Limit: calendarLimits()[0], Cost: 1})
		if !errors.Is(err, store.ErrUnsupported) {
			t.Fatalf("a store without Caps.Calendar took a calendar window: err = %v, want ErrUnsupported", err)
		}
		return
	}
	t.Run("boundaries", func(t *testing.T) {
		CompareWithModel(t, newStore(t), CalendarBoundaryLines(base()))
	})
	for seed := range seeds {
		t.Run(fmt.Sprint("seed", seed), func(t *testing.T) {
			CompareWithModel(t, newStore(t), RandomCalendarLines(uint64(seed), n, base()))
		})
	}
}

// CalendarBoundaryLines returns a trace, at times relative to from, that
// empties a key's window just before each boundary after which a window
// is longer than the one before it (a month after February or after a
// 30-day month, a day or week after a change to summer time), then takes
// just after it, when the new window has begun: the case where a window
// of one length must not refill on the grid of another. Each of the
// calendar limits gets its first such boundary after from, and the
// boundary after a DST change back (a longer window before a shorter one).
func CalendarBoundaryLines(from time.Time) []replay.Line {
	var lines []replay.Line
	for i, l := range calendarLimits() {
		k := fmt.Sprintf("k%d", i)
		found := 0
		for t := from.Add(time.Hour); t.Before(from.Add(800*24*time.Hour)) && found < 2; {
			start, end := calendarWindow(l.Calendar, l.Location, t)
			_, next := calendarWindow(l.Calendar, l.Location, end)
			if (found == 0 && next.Sub(end) > end.Sub(start)) || (found == 1 && next.Sub(end) < end.Sub(start)) {
				found++
				at := func(d time.Duration) time.Duration { return end.Add(d).Sub(from) }
				r := drip.Request{Key: k, Limit: l, Cost: l.Rate}
				one := drip.Request{Key: k, Limit: l, Cost: 1}
				lines = append(lines,
					replay.Line{At: at(-10 * time.Minute), Op: "take", Request: r},
					replay.Line{At: at(-5 * time.Minute), Op: "peek", Request: one},
					replay.Line{At: at(time.Minute), Op: "take", Request: one},
					replay.Line{At: at(30 * time.Minute), Op: "peek", Request: r},
				)
			}
			t = end
		}
	}
	return lines
}
