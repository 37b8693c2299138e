package calendar

import (
	"errors"
	"math/rand/v2"
	"strings"
	"testing"
	"time"
)

func load(t *testing.T, name string) *time.Location {
	t.Helper()
	loc, err := time.LoadLocation(name)
	if err != nil {
		t.Fatalf("time zone %s: %v (the tests need the system's time zone database)", name, err)
	}
	return loc
}

func utc(s string) time.Time {
	t, err := time.Parse(time.RFC3339, s)
	if err != nil {
		panic(err)
	}
	return t
}

// Windows read off the time zone database (zdump -v), by hand.
func TestKnownWindows(t *testing.T) {
	for _, c := range []struct {
		zone       string
		unit       Unit
		at         string
		start, end string
	}{
		// Berlin: a 23-hour day when summer time begins, a 25-hour one when
		// it ends.
		{"Europe/Berlin", Day, "2026-03-29T12:00:00Z", "2026-03-28T23:00:00Z", "2026-03-29T22:00:00Z"},
		{"Europe/Berlin", Day, "2026-10-25T12:00:00Z", "2026-10-24T22:00:00Z", "2026-10-25T23:00:00Z"},
		// Local midnight, not UTC's: 23:30 UTC on the 31st is already
		// February in Berlin.
		{"Europe/Berlin", Month, "2026-01-31T23:30:00Z", "2026-01-31T23:00:00Z", "2026-02-28T23:00:00Z"},
		{"Europe/Berlin", Month, "2026-01-31T22:59:59Z", "2025-12-31T23:00:00Z", "2026-01-31T23:00:00Z"},
		// A leap February, and a month that holds a change of offset.
		{"Europe/Berlin", Month, "2028-02-15T00:00:00Z", "2028-01-31T23:00:00Z", "2028-02-29T23:00:00Z"},
		{"Europe/Berlin", Month, "2026-03-31T21:59:59Z", "2026-02-28T23:00:00Z", "2026-03-31T22:00:00Z"},
		// ISO weeks begin on Monday: 2026-11-26 is a Thursday.
		{"UTC", Week, "2026-11-26T16:00:00Z", "2026-11-23T00:00:00Z", "2026-11-30T00:00:00Z"},
		{"UTC", Week, "2026-11-23T00:00:00Z", "2026-11-23T00:00:00Z", "2026-11-30T00:00:00Z"},
		{"UTC", Week, "2026-11-22T23:59:59Z", "2026-11-16T00:00:00Z", "2026-11-23T00:00:00Z"},
		// A week across a year's end.
		{"UTC", Week, "2027-01-01T00:00:00Z", "2026-12-28T00:00:00Z", "2027-01-04T00:00:00Z"},
		// Santiago skips midnight: on 2026-09-06 the clock goes from
		// 23:59:59 (-04) to 01:00 (-03), so that day starts at 01:00 local.
		{"America/Santiago", Day, "2026-09-06T12:00:00Z", "2026-09-06T04:00:00Z", "2026-09-07T03:00:00Z"},
		{"America/Santiago", Day, "2026-09-06T03:59:59Z", "2026-09-05T04:00:00Z", "2026-09-06T04:00:00Z"},
		// ... and repeats the hour before midnight on 2026-04-04: 25 hours.
		{"America/Santiago", Day, "2026-04-04T12:00:00Z", "2026-04-04T03:00:00Z", "2026-04-05T04:00:00Z"},
		// Apia skipped 2011-12-30 altogether: the 29th ends where the 31st
		// begins.
		{"Pacific/Apia", Day, "2011-12-30T09:59:59Z", "2011-12-29T10:00:00Z", "2011-12-30T10:00:00Z"},
		{"Pacific/Apia", Day, "2011-12-30T10:00:00Z", "2011-12-30T10:00:00Z", "2011-12-31T10:00:00Z"},
		{"Pacific/Apia", Week, "2011-12-30T10:00:00Z", "2011-12-26T10:00:00Z", "2012-01-01T10:00:00Z"}, // six days long,
	} {
		p := Period{Unit: c.unit, Loc: load(t, c.zone)}
		start, end := p.Window(utc(c.at))
		if !start.Equal(utc(c.start)) || !end.Equal(utc(c.end)) {
			t.Errorf("%s %v at %s: window [%s, %s), want [%s, %s)", c.zone, c.unit, c.at,
				start.UTC().Format(time.RFC3339), end.UTC().Format(time.RFC3339), c.start, c.end)
		}
	}
}

// The zones of the random test: summer time on both hemispheres, half-hour
// and 45-minute offsets, a 30-minute summer shift (Lord Howe), clocks that
// skip or repeat midnight (Santiago, São Paulo before 2019, Havana,
// Beirut), a skipped day (Apia), summer time suspended for Ramadan
// (Casablanca), offsets beyond ±12 hours (Kiritimati), and none (UTC).
var zones = []string{
	"UTC", "Europe/Berlin", "Europe/London", "America/New_York", "America/St_Johns",
	"America/Santiago", "America/Sao_Paulo", "America/Havana", "Asia/Beirut",
	"Australia/Lord_Howe", "Asia/Kolkata", "Asia/Kathmandu", "Pacific/Apia",
	"Pacific/Kiritimati", "Pacific/Chatham", "Africa/Casablanca", "Asia/Tehran",
}

// reference finds the window of t by the definition, without offsets'
// bounds: it reads the clock minute by minute (every offset and every
// change of offset since 1980 falls on a whole minute), and a window begins
// wherever the unit of the latest date the clock has read so far changes.
// To be quick it reads every tenth minute, and each minute between two
// readings whose offsets or units differ.
func reference(p Period, t time.Time) (start, end time.Time) {
	// From a day or two before the window can begin: the clock then reads
	// a date of the window before.
	y, m, d := t.In(p.Loc).Date()
	u := p.first(y, m, d)
	from := time.Date(u.y, u.m, u.d-2, 0, 0, 0, 0, time.UTC).Add(-14 * time.Hour).Truncate(time.Minute)
	var seen date // the latest date the clock has read
	read := func(at time.Time) (date, int) {
		local := at.In(p.Loc)
		y, m, d := local.Date()
		if c := (date{y, m, d}); later(c, seen) {
			seen = c
		}
		_, off := local.Zone()
		return p.first(seen.y, seen.m, seen.d), off
	}
	cur, off := read(from)
	for at := from; ; {
		saved := seen
		next, nextOff := read(at.Add(10 * time.Minute))
		if next == cur && nextOff == off {
			at = at.Add(10 * time.Minute)
			continue
		}
		seen = saved
		for range 10 {
			at = at.Add(time.Minute)
			u, o := read(at)
			off = o
			if u == cur {
				continue
			}
			cur = u
			if !at.After(t) {
				start = at
				continue
			}
			return start, at
		}
	}
}

func later(a, b date) bool {
	if a.y != b.y {
		return a.y > b.y
	}
	if a.m != b.m {
		return a.m > b.m
	}
	return a.d > b.d
}

// Random instants, many of them near a change of offset or a month's end,
// in every zone and unit: Window agrees with the reference, and windows are
// contiguous.
func TestWindowsAgreeWithTheDefinition(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 26))
	lo, hi := utc("1980-01-01T00:00:00Z").Unix(), utc("2040-01-01T00:00:00Z").Unix()
	n := 60
	if testing.Short() {
		n = 10
	}
	for _, name := range zones {
		loc := load(t, name)
		for _, unit := range []Unit{Day, Week, Month} {
			p := Period{Unit: unit, Loc: loc}
			for range n {
				at := time.Unix(lo+r.Int64N(hi-lo), r.Int64N(1e9))
				switch r.IntN(3) {
				case 0: // near a change of offset
					if _, end := at.In(loc).ZoneBounds(); !end.IsZero() {
						at = end.Add(time.Duration(r.Int64N(int64(4*time.Hour))) - 2*time.Hour)
					}
				case 1: // near a month's end
					y, m, _ := at.In(loc).Date()
					at = time.Date(y, m+1, 1, 0, 0, 0, 0, loc).Add(time.Duration(r.Int64N(int64(6*time.Hour))) - 3*time.Hour)
				}
				start, end := p.Window(at)
				wantStart, wantEnd := reference(p, at)
				if !start.Equal(wantStart) || !end.Equal(wantEnd) {
					t.Fatalf("%s %v at %s: window [%s, %s), the definition gives [%s, %s)", name, unit,
						at.UTC().Format(time.RFC3339Nano), start.UTC(), end.UTC(), wantStart.UTC(), wantEnd.UTC())
				}
				if s, e := p.Window(end); !s.Equal(end) || !e.After(s) {
					t.Fatalf("%s %v: the window after [%s, %s) is [%s, %s)", name, unit, start.UTC(), end.UTC(), s.UTC(), e.UTC())
				}
				if s, e := p.Window(start.Add(-time.Nanosecond)); !e.Equal(start) || !s.Before(e) {
					t.Fatalf("%s %v: the window before [%s, %s) is [%s, %s)", name, unit, start.UTC(), end.UTC(), s.UTC(), e.UTC())
				}
			}
		}
	}
}

func TestParseUnit(t *testing.T) {
	for _, s := range []string{"day", "week", "month"} {
		u, err := ParseUnit(s)
		if err != nil || u.String() != s {
			t.Errorf("ParseUnit(%q) = %v, %v", s, u, err)
		}
	}
	for _, s := range []string{"", "Day", "year", "30d"} {
		if _, err := ParseUnit(s); err == nil {
			t.Errorf("ParseUnit(%q) is not an error", s)
		}
	}
}

// TestHint: a store handed one window waits on that window's grid; Hint
// moves its waits to the calendar's ends, across a month end and both
// daylight saving changes of Europe/Berlin, and leaves the window handed
// over as it is.
func TestHint(t *testing.T) {
	berlin, err := time.LoadLocation("Europe/Berlin")
	if err != nil {
		t.Fatal(err)
	}
	at := func(s string) time.Time {
		t.Helper()
		v, err := time.ParseInLocation("2006-01-02 15:04:05", s, berlin)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	month, day := Period{Month, berlin}, Period{Day, berlin}
	for _, tc := range []struct {
		name string
		p    Period
		// window is the window the store was handed; store is its
		// clock, caller the caller's; grid is the store's wait, as an
		// instant on the window's grid; want the calendar's.
		window         string
		store, caller  string
		grid, want     string
		unchanged, off bool
	}{
		{name: "past January's end: February is 28 days", p: month, window: "2026-01-15 12:00:00",
			store: "2026-02-01 00:00:10", caller: "2026-01-31 23:59:59",
			grid: "2026-03-04 00:00:00", want: "2026-03-01 00:00:00"},
		{name: "past February's end: March is 31 days", p: month, window: "2026-02-15 12:00:00",
			store: "2026-03-01 00:00:01", caller: "2026-02-28 23:59:58",
			grid: "2026-03-29 00:00:00", want: "2026-04-01 00:00:00"},
		{name: "a debt into the next month", p: month, window: "2026-01-15 12:00:00",
			store: "2026-01-20 08:00:00", caller: "2026-01-20 08:00:00",
			grid: "2026-03-04 00:00:00", want: "2026-03-01 00:00:00"},
		{name: "a debt two months on", p: month, window: "2026-01-15 12:00:00",
			store: "2026-01-20 08:00:00", caller: "2026-01-20 08:00:00",
			grid: "2026-04-04 01:00:00", want: "2026-04-01 00:00:00"}, // the grid in CET
		// Berlin's clocks go forward on 2026-03-29 (a day of 23 hours)
		// and back on 2026-10-25 (25 hours).
		{name: "past the day before spring: a day of 23 hours", p: day, window: "2026-03-28 12:00:00",
			store: "2026-03-29 00:00:05", caller: "2026-03-28 23:59:59",
			grid: "2026-03-30 01:00:00", want: "2026-03-30 00:00:00"},
		{name: "past the day before autumn: a day of 25 hours", p: day, window: "2026-10-24 12:00:00",
			store: "2026-10-25 00:00:05", caller: "2026-10-24 23:59:59",
			grid: "2026-10-25 23:00:00", want: "2026-10-26 00:00:00"},
		{name: "within the window: its own end", p: month, window: "2026-01-15 12:00:00",
			store: "2026-01-31 23:59:59", caller: "2026-02-01 00:00:03",
			grid: "2026-02-01 00:00:00", want: "2026-02-01 00:00:00"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			start, end := tc.p.Window(at(tc.window))
			store := at(tc.store)
			h := at(tc.grid).Sub(store)
			got := tc.p.Hint(end, end.Sub(start), at(tc.caller), h)
			if want := at(tc.want).Sub(store); got != want {
				t.Errorf("Hint(%v) = %v, want %v (to %s)", h, got, want, tc.want)
			}
		})
	}
	start, end := month.Window(at("2026-01-15 12:00:00"))
	for _, h := range []time.Duration{0, -1, 100 * 31 * 24 * time.Hour} {
		if got := month.Hint(end, end.Sub(start), at("2026-02-01 00:00:00"), h); got != h {
			t.Errorf("Hint(%v) = %v: no wait and a wait far out stay as they are", h, got)
		}
	}
}

// TestLoadZone: the names of the time zone database load (the same
// Location each time); a name with a path trick, one of the machine's own
// files, or too long is refused before any file is read.
func TestLoadZone(t *testing.T) {
	for _, name := range []string{"Europe/Berlin", "UTC", "Etc/GMT+5", "EST5EDT", "America/Port-au-Prince", "America/Argentina/ComodRivadavia", "GMT-0"} {
		a, err := LoadZone(name)
		if err != nil {
			t.Errorf("%q: %v", name, err)
			continue
		}
		if b, _ := LoadZone(name); a != b || a.String() != name {
			t.Errorf("%q: %v then %v", name, a, b)
		}
	}
	for _, name := range []string{"", "Local", "localtime", "posixrules", "right/UTC", "posix/Europe/Berlin",
		"./Europe/Berlin", "Europe//Berlin", "Europe/./Berlin", "Europe/../Europe/Berlin", "../../etc/passwd",
		"/etc/localtime", "Europe/Berlin/", "Europe/Berlin\x00", "zone.tab", "tzdata.zi", "Europe\\Berlin",
		"Europe/" + strings.Repeat("a", 60), strings.Repeat("A/", 1000) + "B"} {
		if loc, err := LoadZone(name); !errors.Is(err, ErrZoneName) {
			t.Errorf("%q: %v, %v, want ErrZoneName", name, loc, err)
		}
	}
	for _, name := range []string{"Mars/Olympus", "leapseconds", "SystemV/AST4", "europe/berlin"} {
		if loc, err := LoadZone(name); err == nil || errors.Is(err, ErrZoneName) {
			t.Errorf("%q: %v, %v, want an unknown zone", name, loc, err)
		}
	}
}
