package drip

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/driplimit/drip/bucket"
	"github.com/driplimit/drip/internal/calendar"
	"github.com/driplimit/drip/store"
)

// Algorithm names the kind of a limit. TokenBucket and FixedWindow
// refill a bucket. SlidingWindow counts within a rolling window.
// Concurrency bounds the requests in flight.
type Algorithm string

const (
	// TokenBucket refills continuously (or on an interval grid, see Refill).
	// It is the default.
	TokenBucket Algorithm = "token_bucket"
	// FixedWindow adds Rate tokens at the start of every window of length
	// Period, on a grid anchored at Start.
	FixedWindow Algorithm = "fixed_window"
	// Concurrency bounds the requests in flight, not the requests per
	// period. A take acquires one of MaxInFlight slots under a lease
	// (Request.Lease). A refund of the lease releases it. A lease not
	// released within LeaseTTL frees its slot by itself. See
	// Limiter.Acquire.
	Concurrency Algorithm = "concurrency"
	// SlidingWindow allows at most Rate tokens in any rolling window of
	// length Period. A denial reaches back at most one slot (Period/Slots)
	// further than Period. See docs/semantics.md.
	SlidingWindow Algorithm = "sliding_window"
)

// Refill names how a token bucket refills.
type Refill string

const (
	// Continuous adds tokens at Rate/Period at every instant. The default.
	Continuous Refill = "continuous"
	// Interval adds Rate tokens at once each time a whole Period has passed
	// since the bucket's grid began (its first request).
	Interval Refill = "interval"
)

// Amounts (rates, bursts, costs, tokens) are held as fixed-point integers
// of millionths of a token (package bucket), so that state never drifts. A
// limit's amounts are rounded to the nearest millionth of a token when they
// enter drip; costs and refunds are rounded up, so that no cost is free.

// maxAmount bounds rates, bursts and costs so that fixed-point values keep
// headroom in an int64.
const maxAmount = store.MaxAmount

// Limit describes one rate limit: a token bucket, a fixed window, a
// sliding window or a concurrency limit. The zero value is not usable.
// Rate limits need a Rate (PerSecond, Per); a concurrency limit needs a
// MaxInFlight (InFlight). A Limit is a small value: copy and compare it.
type Limit struct {
	// Algorithm is TokenBucket (the zero value), FixedWindow,
	// SlidingWindow or Concurrency. Rate and Period describe the rate
	// limits. MaxInFlight and LeaseTTL describe Concurrency alone.
	// Validate says which other fields each one takes.
	Algorithm Algorithm
	// Rate is how many tokens a Period allows; it may be fractional. It
	// must be > 0, except for Concurrency, where it is zero.
	Rate float64
	// Period is the time Rate tokens take to refill, or the length of a
	// window. Zero means one second, except for a Calendar window.
	Period time.Duration
	// Burst is the bucket's capacity. Zero means Rate. A sliding or
	// calendar window holds Rate: Burst stays zero or Rate.
	Burst float64
	// Refill is Continuous (the zero value) or Interval; token buckets only.
	Refill Refill
	// Start is, for fixed windows, the offset of the window grid from the
	// Unix epoch, modulo Period. Zero means an offset hashed from the key,
	// so that the windows of different keys open at different times. Set
	// Start to Period to open them on the minute or the hour.
	Start time.Duration
	// MaxReserved is the most debt, in tokens, a reservation may run up.
	// Zero means 1e12, the largest amount drip takes.
	MaxReserved float64
	// MaxInFlight is how many leases a Concurrency limit lets be held at
	// once, from 1 to store.MaxInFlight. Other algorithms leave it zero.
	MaxInFlight int
	// LeaseTTL is how long a Concurrency lease lasts unless released. The
	// slot of a crashed holder comes back after it. Zero means
	// store.DefaultLeaseTTL. Other algorithms leave it zero.
	LeaseTTL time.Duration
	// Slots is how many slots a SlidingWindow is cut into: 1 to 1000,
	// zero meaning 10. More slots count closer to the exact window, at the
	// cost of a count per slot per key. Other algorithms leave it zero.
	Slots int
	// Calendar makes a FixedWindow follow the calendar: "day", "week"
	// (ISO, from Monday) or "month". Each window starts at local midnight
	// in Location, DST included. Period and Start then stay zero. See
	// docs/semantics.md.
	Calendar string
	// Location is the time zone of a Calendar window (nil: UTC).
	Location *time.Location
	// Leased marks a token bucket or a fixed window as leased. A store
	// wrapped by package store/leased then decides it from blocks of its
	// tokens, at memory speed and never over the limit. The mark goes with
	// every request to the store (bucket.Prepared.Leased), so every
	// instance obeys the blocks out. Other stores ignore it. Sliding
	// windows and concurrency limits are not leased. It is not part of a
	// limit's JSON. See docs/semantics.md, "Leased tokens".
	Leased bool
}

// InFlight returns a concurrency limit of n slots whose leases last ttl
// (zero: store.DefaultLeaseTTL) unless released.
func InFlight(n int, ttl time.Duration) Limit {
	return Limit{Algorithm: Concurrency, MaxInFlight: n, LeaseTTL: ttl}
}

func (l Limit) leaseTTL() time.Duration {
	if l.LeaseTTL == 0 {
		return store.DefaultLeaseTTL
	}
	return l.LeaseTTL
}

// PerSecond returns a token bucket of rate tokens per second, with a burst
// of rate.
func PerSecond(rate float64) Limit { return Per(rate, time.Second) }

// PerMinute returns a token bucket of rate tokens per minute, with a burst
// of rate.
func PerMinute(rate float64) Limit { return Per(rate, time.Minute) }

// PerHour returns a token bucket of rate tokens per hour, with a burst of
// rate.
func PerHour(rate float64) Limit { return Per(rate, time.Hour) }

// Per returns a token bucket of rate tokens per period, with a burst of
// rate: Per(5, 10*time.Second) adds 5 tokens every 10 seconds, one every
// 2 seconds.
func Per(rate float64, period time.Duration) Limit {
	return Limit{Rate: rate, Period: period}
}

// WithBurst returns l with capacity burst.
func (l Limit) WithBurst(burst float64) Limit { l.Burst = burst; return l }

// WithRefill returns l with the given refill.
func (l Limit) WithRefill(r Refill) Limit { l.Refill = r; return l }

// WithMaxReserved returns l with a bound on reservation debt.
func (l Limit) WithMaxReserved(n float64) Limit { l.MaxReserved = n; return l }

// WithLeased returns l marked Leased (on) or not.
func (l Limit) WithLeased(on bool) Limit { l.Leased = on; return l }

// Window returns l as a fixed window limit.
func (l Limit) Window() Limit { l.Algorithm = FixedWindow; return l }

// Sliding returns l as a sliding window: at most Rate tokens in any
// rolling window of Period, counted in Slots slots (10 unless WithSlots).
// PerMinute(100).Sliding() never lets 101 through in any minute. Its
// burst is its rate.
func (l Limit) Sliding() Limit { l.Algorithm = SlidingWindow; return l }

// WithSlots returns l, a sliding window, cut into n slots (1 to 1000).
func (l Limit) WithSlots(n int) Limit { l.Slots = n; return l }

// PerDayIn returns a fixed window of n tokens per calendar day in loc
// (nil: UTC). Each day's window starts full at local midnight, whether
// the day has 23, 24 or 25 hours.
func PerDayIn(n float64, loc *time.Location) Limit { return perCalendar(n, "day", loc) }

// PerWeekIn returns a fixed window of n tokens per ISO week in loc (nil:
// UTC), from Monday at local midnight.
func PerWeekIn(n float64, loc *time.Location) Limit { return perCalendar(n, "week", loc) }

// PerMonthIn returns a fixed window of n tokens per calendar month in loc
// (nil: UTC), from the 1st at local midnight, whatever the month's length.
func PerMonthIn(n float64, loc *time.Location) Limit { return perCalendar(n, "month", loc) }

func perCalendar(n float64, unit string, loc *time.Location) Limit {
	return Limit{Algorithm: FixedWindow, Rate: n, Calendar: unit, Location: loc}
}

// Errors returned for bad input, the two a caller most often tests for:
// a limit that is not valid, and a cost no wait can allow. They are
// wrapped with details; test with errors.Is. Every bad input is a
// *store.InputError, and package store names the rest (a missing or too
// long key, a bad cost, a key twice in a multi-take). Being over the
// limit is never an error: it is a Decision.
var (
	ErrInvalidLimit     = store.ErrInvalidLimit
	ErrCostExceedsBurst = store.ErrCostExceedsBurst
)

func (l Limit) period() time.Duration {
	if l.Period == 0 {
		return time.Second
	}
	return l.Period
}

func (l Limit) burst() float64 {
	if l.Burst == 0 {
		return l.Rate
	}
	return l.Burst
}

// Validate reports whether l is usable, and why not.
func (l Limit) Validate() error {
	if l.Algorithm == Concurrency {
		return l.validateConcurrency()
	}
	var problems []string
	if l.MaxInFlight != 0 || l.LeaseTTL != 0 {
		problems = append(problems, "max_in_flight and lease_ttl apply to concurrency only")
	}
	switch l.Algorithm {
	case "", TokenBucket:
	case FixedWindow:
		if l.Refill != "" {
			problems = append(problems, "refill applies to token_bucket only")
		}
	case SlidingWindow:
		if l.Refill != "" || l.Start != 0 || l.MaxReserved != 0 || (l.Burst != 0 && l.Burst != l.Rate) {
			problems = append(problems, "refill, start, max_reserved and a burst other than the rate do not apply to sliding_window")
		}
		if l.Slots < 0 || l.Slots > bucket.MaxSlots {
			problems = append(problems, fmt.Sprintf("slots must be from 1 to %d", bucket.MaxSlots))
		} else if l.period() < time.Duration(l.slots())*time.Microsecond {
			problems = append(problems, "a sliding window's slots must be at least a microsecond long (period >= slots µs)")
		}
		if l.Rate > store.MaxSlidingRate {
			problems = append(problems, "a sliding window's rate must be at most 1e9")
		}
	default:
		problems = append(problems, fmt.Sprintf("algorithm %q is not token_bucket, fixed_window, sliding_window or concurrency", l.Algorithm))
	}
	if l.Slots != 0 && l.Algorithm != SlidingWindow {
		problems = append(problems, "slots applies to sliding_window only")
	}
	if l.Leased && l.Algorithm == SlidingWindow {
		problems = append(problems, "a sliding_window is not leased (token_bucket and fixed_window are)")
	}
	problems = append(problems, l.checkCalendar()...)
	switch l.Refill {
	case "", Continuous, Interval:
	default:
		problems = append(problems, fmt.Sprintf("refill %q is not continuous or interval", l.Refill))
	}
	if bad := checkAmount(l.Rate); bad != "" {
		problems = append(problems, "rate "+bad)
	}
	if l.Period < 0 {
		problems = append(problems, "period must be > 0")
	}
	if l.Burst != 0 || l.Rate > 0 {
		if bad := checkAmount(l.burst()); bad != "" {
			problems = append(problems, "burst "+bad)
		}
	}
	if l.MaxReserved < 0 || math.IsNaN(l.MaxReserved) || l.MaxReserved > maxAmount {
		problems = append(problems, "max_reserved must be >= 0 and at most 1e12")
	}
	if l.Start < 0 {
		problems = append(problems, "start must be >= 0")
	}
	if len(problems) == 0 {
		return nil
	}
	return fmt.Errorf("%w: %s", ErrInvalidLimit, strings.Join(problems, "; "))
}

// validateConcurrency is Validate for a Concurrency limit: slots and a
// TTL, and none of the fields of the other algorithms.
func (l Limit) validateConcurrency() error {
	var problems []string
	if l.MaxInFlight < 1 || l.MaxInFlight > store.MaxInFlight {
		problems = append(problems, fmt.Sprintf("max_in_flight must be from 1 to %d", store.MaxInFlight))
	}
	if l.LeaseTTL < 0 || l.LeaseTTL > store.MaxLeaseTTL {
		problems = append(problems, "lease_ttl must be > 0 and at most 24h")
	}
	if l.Rate != 0 || l.Period != 0 || l.Burst != 0 || l.Refill != "" || l.Start != 0 || l.MaxReserved != 0 {
		problems = append(problems, "rate, period, burst, refill, start and max_reserved do not apply to concurrency")
	}
	if l.Leased {
		problems = append(problems, "a concurrency limit is not leased (token_bucket and fixed_window are)")
	}
	if len(problems) == 0 {
		return nil
	}
	return fmt.Errorf("%w: %s", ErrInvalidLimit, strings.Join(problems, "; "))
}

func checkAmount(x float64) string {
	switch {
	case math.IsNaN(x) || math.IsInf(x, 0):
		return "must be a finite number"
	case x <= 0:
		return "must be > 0"
	case x > maxAmount:
		return "must be at most 1e12"
	case toMicro(x) == 0:
		return "must be at least 0.000001"
	}
	return ""
}

// checkCalendar is Validate for the fields of a calendar window.
func (l Limit) checkCalendar() []string {
	if l.Calendar == "" {
		if l.Location != nil {
			return []string{"time_zone applies to a calendar period only"}
		}
		return nil
	}
	var problems []string
	if _, err := calendar.ParseUnit(l.Calendar); err != nil {
		problems = append(problems, err.Error())
	}
	if l.Algorithm != FixedWindow {
		problems = append(problems, "a calendar period applies to fixed_window only")
	}
	if l.Period != 0 || l.Start != 0 || l.MaxReserved != 0 || (l.Burst != 0 && l.Burst != l.Rate) {
		problems = append(problems, "a calendar period takes no period, start, max_reserved or burst other than the rate")
	}
	return problems
}

// String renders l compactly, e.g. "10/1s burst 20" or
// "fixed_window 100/1m0s burst 100".
func (l Limit) String() string {
	var b strings.Builder
	if l.Algorithm == Concurrency {
		return "concurrency " + strconv.Itoa(l.MaxInFlight) + " lease_ttl " + l.leaseTTL().String()
	}
	if l.Algorithm == FixedWindow || l.Algorithm == SlidingWindow {
		b.WriteString(string(l.Algorithm) + " ")
	}
	b.WriteString(strconv.FormatFloat(l.Rate, 'g', -1, 64))
	b.WriteString("/")
	if l.Calendar != "" {
		b.WriteString(l.Calendar)
		if l.Location != nil {
			b.WriteString(" " + l.Location.String())
		}
	} else {
		b.WriteString(l.period().String())
	}
	b.WriteString(" burst ")
	b.WriteString(strconv.FormatFloat(l.burst(), 'g', -1, 64))
	if l.Refill == Interval {
		b.WriteString(" interval")
	}
	if l.Slots != 0 {
		b.WriteString(" slots ")
		b.WriteString(strconv.Itoa(l.Slots))
	}
	if l.MaxReserved > 0 {
		b.WriteString(" max_reserved ")
		b.WriteString(strconv.FormatFloat(l.MaxReserved, 'g', -1, 64))
	}
	return b.String()
}

// forKey returns l with every default that depends on the key made
// explicit: for a fixed window without Start, the hashed offset of key.
func (l Limit) forKey(key string) Limit {
	if l.Algorithm == FixedWindow && l.Start == 0 && l.Calendar == "" {
		l.Start = store.WindowStart(key, l.period())
		if l.Start == 0 {
			l.Start = l.period()
		}
	}
	return l
}

// Params validates l and resolves it to fixed point for key: what a store
// executes. The key places the grid of a fixed window without Start.
// Front doors that compile limits once call it. A calendar window's
// params are those of the present window; decisions resolve theirs at
// their own time.
func (l Limit) Params(key string) (bucket.Params, error) { return l.paramsAt(key, time.Time{}) }

// paramsAt is Params for a decision at t (zero: now, by the caller's
// clock, which places a calendar window when the store decides on its
// own clock: see bucket.Calendar).
func (l Limit) paramsAt(key string, t time.Time) (bucket.Params, error) {
	if err := l.Validate(); err != nil {
		return bucket.Params{}, err
	}
	l = l.forKey(key)
	if l.Algorithm == Concurrency {
		return bucket.Params{
			Kind:   bucket.Concurrency,
			Burst:  int64(l.MaxInFlight) * bucket.Micro,
			Period: int64(l.leaseTTL()),
		}, nil
	}
	p := bucket.Params{
		Rate:   toMicro(l.Rate),
		Period: int64(l.period()),
		Burst:  toMicro(l.burst()),
		// No bound on reservations is, in fixed point, the largest amount
		// drip takes (1e12 tokens): debt then stays far inside an int64,
		// and burst - tokens cannot overflow however many reservations
		// pile up.
		MaxReserved: toMicro(maxAmount),
	}
	if l.MaxReserved > 0 {
		p.MaxReserved = toMicro(l.MaxReserved)
	}
	switch {
	case l.Calendar != "":
		if t.IsZero() {
			t = wallNow()
		}
		p.Kind = bucket.Calendar
		p.Start, p.Period = l.calendarPeriod().Span(t)
		p.Rate = p.Burst
	case l.Algorithm == SlidingWindow:
		// The limit is a count: the rate is the burst (so that a divided
		// limit stays whole), and reserve is refused.
		p.Kind = bucket.Sliding
		p.Rate = p.Burst
		p.MaxReserved = 0
		p.Parts = int64(min(int64(l.slots()), p.Period))
	case l.Algorithm == FixedWindow:
		p.Kind = bucket.Window
		p.Start = int64(l.Start) % p.Period
	case l.Refill == Interval:
		p.Kind = bucket.Interval
	}
	return p, nil
}

// calendarPeriod is the calendar period of a valid calendar window.
func (l Limit) calendarPeriod() calendar.Period {
	u, _ := calendar.ParseUnit(l.Calendar)
	return calendar.Period{Unit: u, Loc: l.Location}
}

func (l Limit) slots() int {
	if l.Slots == 0 {
		return bucket.DefaultSlots
	}
	return l.Slots
}

// keyDependent reports whether l's Params depend on the key (or, for a
// calendar window, on the time), so that a Limiter resolves them at each
// decision.
func (l Limit) keyDependent() bool {
	return l.Algorithm == FixedWindow && (l.Start == 0 || l.Calendar != "")
}

func toMicro(x float64) int64 { return int64(math.Round(x * bucket.Micro)) }

// wallNow is the caller's clock where a decision has no time of its own
// (the store decides on its clock): the calendar window it places, and
// the time its wait hints are read from. A variable for tests.
var wallNow = time.Now

// calendarHints puts the wait hints of a calendar window's result on the
// calendar (see calendar.Period.Hint): p is the window the store was
// handed, at the decision's time (zero: the store's, read here as the
// caller's clock after the store answered).
func calendarHints(r *bucket.Result, l *Limit, p *bucket.Params, at time.Time) {
	if p.Kind != bucket.Calendar {
		return
	}
	if at.IsZero() {
		at = wallNow()
	}
	l.calendarPeriod().Hints(p.Start, p.Period, at, &r.RetryAfter, &r.ResetAfter)
}
