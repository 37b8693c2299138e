// Package calendar finds the windows of calendar periods (a day, a week, a
// month) in a time zone: "10,000 per calendar month in Europe/Berlin"
// resets on the 1st at local midnight, whatever the month's length and
// whatever daylight saving time does in it.
//
// A period's windows are computed here, in Go, because the stores' scripts
// (Lua, SQL) have no time zone database: a store is handed a window's start
// and end as instants.
//
// The definition, for zones whose clocks jump: a window starts at the first
// instant at which the zone's clock reads its first day (or a later one).
// Where a zone skips midnight (a clock going from 23:59:59 straight to
// 01:00), the day starts at 01:00; where a clock goes back across midnight
// (from 00:30 to 23:30 of the day before), the instants of the repeated
// hour belong to the day that had already begun. Windows are contiguous:
// each ends where the next starts, so every instant is in exactly one.
package calendar

import (
	"fmt"
	"math"
	"time"
)

// Unit is the length of a calendar period.
type Unit uint8

const (
	// Day is a calendar day, from local midnight to local midnight: 23, 24
	// or 25 hours (or other lengths where a zone changes its offset by
	// other amounts).
	Day Unit = iota + 1
	// Week is an ISO 8601 week: it starts on Monday at local midnight.
	Week
	// Month is a calendar month: it starts on the 1st at local midnight.
	Month
)

// ParseUnit reads a unit as the rules file writes it: "day", "week" or
// "month".
func ParseUnit(s string) (Unit, error) {
	switch s {
	case "day":
		return Day, nil
	case "week":
		return Week, nil
	case "month":
		return Month, nil
	}
	return 0, fmt.Errorf("calendar period %q: want day, week or month", s)
}

func (u Unit) String() string {
	switch u {
	case Day:
		return "day"
	case Week:
		return "week"
	case Month:
		return "month"
	}
	return fmt.Sprintf("unit(%d)", uint8(u))
}

// Period is a calendar unit in a time zone.
type Period struct {
	Unit Unit
	Loc  *time.Location
}

// Window returns the window of p that holds t: the instants from start
// (included) to end (excluded).
func (p Period) Window(t time.Time) (start, end time.Time) {
	loc := p.Loc
	if loc == nil {
		loc = time.UTC
	}
	y, m, d := t.In(loc).Date()
	u := p.first(y, m, d)
	start = firstInstant(u, loc)
	for {
		// t's clock reads a date of the window u or later, so t is past
		// start; it is in a later window only when the clock went back
		// across a boundary after the next window began.
		next := p.next(u)
		end = firstInstant(next, loc)
		if t.Before(end) {
			return start, end
		}
		u, start = next, end
	}
}

// Span is the window of p that holds t as a store is handed it: its
// start and length in nanoseconds. A window that began before the first
// instant of int64 nanoseconds (in 1677) is counted from that instant,
// and still ends where it ends.
func (p Period) Span(t time.Time) (start, length int64) {
	s, e := p.Window(t)
	if first := time.Unix(0, math.MinInt64); s.Before(first) {
		s = first
	}
	return s.UnixNano(), e.Sub(s).Nanoseconds()
}

// Hints puts a store's two waits (a retry and a reset) on the calendar
// (Hint): start and length are the window the store was handed (Span),
// at the decision's time.
func (p Period) Hints(start, length int64, at time.Time, retry, reset *time.Duration) {
	end, l := time.Unix(0, start+length), time.Duration(length)
	*retry = p.Hint(end, l, at, *retry)
	*reset = p.Hint(end, l, at, *reset)
}

// date is a day of the proleptic Gregorian calendar.
type date struct {
	y int
	m time.Month
	d int
}

// first is the first day of the window of p that holds the day y-m-d.
func (p Period) first(y int, m time.Month, d int) date {
	switch p.Unit {
	case Week:
		// Monday is the first day of an ISO week.
		wd := int(time.Date(y, m, d, 0, 0, 0, 0, time.UTC).Weekday())
		back := (wd + 6) % 7
		n := time.Date(y, m, d-back, 0, 0, 0, 0, time.UTC)
		return date{n.Year(), n.Month(), n.Day()}
	case Month:
		return date{y, m, 1}
	}
	return date{y, m, d}
}

// next is the first day of the window after the one that starts on u.
func (p Period) next(u date) date {
	var n time.Time
	switch p.Unit {
	case Week:
		n = time.Date(u.y, u.m, u.d+7, 0, 0, 0, 0, time.UTC)
	case Month:
		n = time.Date(u.y, u.m+1, 1, 0, 0, 0, 0, time.UTC)
	default:
		n = time.Date(u.y, u.m, u.d+1, 0, 0, 0, 0, time.UTC)
	}
	return date{n.Year(), n.Month(), n.Day()}
}

// firstInstant is the first instant at which loc's clock reads day u or a
// later day. It walks loc's offsets from two days before (no zone is more
// than 26 hours from UTC, nor moves its clock by a day) and, in each span of
// one offset, asks whether the span's clock reaches u's midnight.
func firstInstant(u date, loc *time.Location) time.Time {
	midnight := time.Date(u.y, u.m, u.d, 0, 0, 0, 0, time.UTC).Unix() // u's midnight on the local clock, as seconds
	at := time.Unix(midnight-2*86400, 0)
	for range 64 {
		local := at.In(loc)
		_, ze := local.ZoneBounds()
		_, off := local.Zone()
		// From at to ze the clock reads instant + off.
		if at.Unix()+int64(off) >= midnight {
			// The span begins past midnight: the clock jumped over it.
			return local
		}
		m := time.Unix(midnight-int64(off), 0)
		if ze.IsZero() || m.Before(ze) {
			return m.In(loc)
		}
		at = ze
	}
	// Unreachable for any zone of the time zone database: no zone changes
	// its offset 64 times in four days.
	return time.Unix(midnight, 0).In(loc)
}

// maxGrid is how many windows past its end Hint follows a store's grid: a
// calendar window's debt is at most one window's count, so a store's wait
// reaches at most two windows on; a hint further out is left as it is.
const maxGrid = 8

// Hint puts a store's wait hint on the calendar. A store is handed one
// window, [end-length, end), and lays the windows after it on that
// window's grid, each as long as it: a store whose clock has passed end
// (or a bucket in debt) counts right but waits, after a month of 31 days,
// for a February of 31. h is a wait the store reported (a retry or a
// reset), at is the caller's time of the decision: at+h names an instant,
// and the grid's end nearest to it, end + k*length, is moved to the end of
// the k-th window after end on the calendar. A store's clock off the
// caller's by less than half a window changes nothing; h <= 0 (no wait)
// is returned as it is, and a wait is never made less than a nanosecond.
func (p Period) Hint(end time.Time, length time.Duration, at time.Time, h time.Duration) time.Duration {
	if h <= 0 || length <= 0 || h > (maxGrid+1)*length {
		return h
	}
	// at+h-end, in nanoseconds, is within a few windows of 0 for any time
	// a store decides at (a caller's clock within 292 years of end).
	off := at.Sub(end) + h
	if off < length/2 {
		return h // at or before end: the window handed over
	}
	k := int((off + length/2) / length)
	if k > maxGrid {
		return h
	}
	e := end
	for range k {
		_, e = p.Window(e)
	}
	return max(h+e.Sub(end)-time.Duration(k)*length, time.Nanosecond)
}
