package storetest

import (
	"math"
	"math/big"
	"time"

	_ "time/tzdata" // the zones of the calendar traces, on any machine

	"github.com/driplimit/drip"
	"github.com/driplimit/drip/bucket"
)

// The model of a calendar window (docs/semantics.md), written from the
// definition rather than from internal/calendar or bucket.Eval: a window
// of a day, an ISO week or a month starts at the first instant at which
// the zone's clock reads its first day or a later one, and ends where the
// next starts. A key holds Rate tokens in each window: its count starts
// full at each window's start, a take is allowed while the count covers
// it, a refund gives back up to Rate, and a denial's wait (and the reset)
// is the window's end. The model finds a window's start by brute force,
// walking the instants around the day's midnight by 15 minutes (every
// offset of the time zone database is a multiple of 15 minutes, and no
// zone changes it twice within 15 minutes), then bisecting to the
// nanosecond.

// calendarWindow is the window of unit ("day", "week", "month") in loc
// that holds t.
func calendarWindow(unit string, loc *time.Location, t time.Time) (start, end time.Time) {
	y, m, d := t.In(loc).Date()
	first := firstDay(unit, time.Date(y, m, d, 0, 0, 0, 0, time.UTC))
	for {
		next := nextFirstDay(unit, first)
		start, end = dayStart(first, loc), dayStart(next, loc)
		if t.Before(end) {
			return start, end
		}
		first = next // the clock went back over the boundary
	}
}

// firstDay is the first day (a UTC midnight naming a date) of the window
// of unit that holds the date d.
func firstDay(unit string, d time.Time) time.Time {
	switch unit {
	case "week":
		for d.Weekday() != time.Monday {
			d = d.AddDate(0, 0, -1)
		}
		return d
	case "month":
		return d.AddDate(0, 0, 1-d.Day())
	}
	return d
}

func nextFirstDay(unit string, d time.Time) time.Time {
	switch unit {
	case "week":
		return d.AddDate(0, 0, 7)
	case "month":
		return d.AddDate(0, 1, 0)
	}
	return d.AddDate(0, 0, 1)
}

// dayStart is the first instant at which loc's clock reads the date of
// day (a UTC midnight) or a later one.
func dayStart(day time.Time, loc *time.Location) time.Time {
	reads := func(x time.Time) bool {
		y, m, d := x.In(loc).Date()
		return !time.Date(y, m, d, 0, 0, 0, 0, time.UTC).Before(day)
	}
	const step = 15 * time.Minute
	x := day.Add(-27 * time.Hour)
	for !reads(x) {
		x = x.Add(step)
	}
	lo, hi := x.Add(-step), x // reads(hi), !reads(lo)
	for hi.Sub(lo) > 1 {
		mid := lo.Add(hi.Sub(lo) / 2)
		if reads(mid) {
			hi = mid
		} else {
			lo = mid
		}
	}
	return hi
}

// calendarCount is one key's count in the model: its tokens in micro-
// tokens, in the window that starts at start.
type calendarCount struct {
	start  time.Time
	tokens int64
}

func (m *Model) applyCalendar(op bucket.Op, p bucket.Prepared, l drip.Limit, at time.Time, write bool) ModelDecision {
	rate := int64(math.Round(l.Rate * bucket.Micro)) // as a limit's amounts round
	loc := l.Location
	if loc == nil {
		loc = time.UTC
	}
	start, end := calendarWindow(l.Calendar, loc, at)
	c, ok := m.counts[p.Key]
	if ok && start.Before(c.start) {
		// The clock went back across the start of the window the key
		// counts in: a time before the state's adds nothing and removes
		// nothing (docs/semantics.md), so the decision is made in that
		// window, never in an earlier one granted again.
		start, end = calendarWindow(l.Calendar, loc, c.start)
	}
	if !ok || !c.start.Equal(start) {
		c = calendarCount{start: start, tokens: rate}
	}
	untilEnd := big.NewRat(end.Sub(at).Nanoseconds(), 1)
	d := ModelDecision{Burst: big.NewRat(rate, bucket.Micro), Cost: big.NewRat(p.Cost, bucket.Micro), RetryNs: new(big.Rat)}
	switch {
	case op == bucket.Refund:
		d.Allowed = true
		c.tokens = min(rate, c.tokens+p.Cost)
	case c.tokens >= p.Cost:
		// A peek answers as the take would, and writes nothing.
		d.Allowed = true
		c.tokens -= p.Cost
	default:
		d.RetryNs = untilEnd
	}
	d.Tokens = big.NewRat(c.tokens, bucket.Micro)
	d.ResetNs = new(big.Rat)
	if c.tokens < rate {
		d.ResetNs = untilEnd
	}
	if write && d.Allowed && op != bucket.Peek {
		m.counts[p.Key] = c
	}
	return d
}
