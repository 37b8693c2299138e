package drip

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"time"

	"github.com/driplimit/drip/bucket"
	"github.com/driplimit/drip/internal/calendar"
	"github.com/driplimit/drip/internal/seconds"
)

// The JSON shapes of docs/api.md, shared by drip replay, the decision API and
// the rules file: times are seconds as numbers, a period is a Go duration
// string ("10s") or a number of seconds.

type limitJSON struct {
	Algorithm   Algorithm         `json:"algorithm,omitempty"`
	Rate        float64           `json:"rate,omitempty"`
	Period      *periodJSON       `json:"period,omitempty"`
	TimeZone    string            `json:"time_zone,omitempty"`
	Slots       *int              `json:"slots,omitempty"`
	Burst       *float64          `json:"burst,omitempty"`
	Refill      Refill            `json:"refill,omitempty"`
	Start       *seconds.Duration `json:"start,omitempty"`
	MaxReserved float64           `json:"max_reserved,omitempty"`
	MaxInFlight int               `json:"max_in_flight,omitempty"`
	LeaseTTL    *seconds.Duration `json:"lease_ttl,omitempty"`
}

// MarshalJSON encodes l as {"rate": 10, "period": "1s", ...}.
func (l Limit) MarshalJSON() ([]byte, error) {
	j := limitJSON{Algorithm: l.Algorithm, Rate: l.Rate, Refill: l.Refill, MaxReserved: l.MaxReserved, MaxInFlight: l.MaxInFlight}
	if l.Slots != 0 {
		j.Slots = &l.Slots
	}
	if l.Calendar != "" {
		j.Period = &periodJSON{calendar: l.Calendar}
	}
	if l.Location != nil {
		j.TimeZone = l.Location.String()
	}
	if l.LeaseTTL != 0 {
		t := seconds.Duration(l.LeaseTTL)
		j.LeaseTTL = &t
	}
	if l.Period != 0 {
		j.Period = &periodJSON{d: seconds.Duration(l.Period)}
	}
	if l.Burst != 0 {
		j.Burst = &l.Burst
	}
	if l.Start != 0 {
		s := seconds.Duration(l.Start)
		j.Start = &s
	}
	return json.Marshal(j)
}

// UnmarshalJSON decodes a limit strictly: unknown fields are errors. An
// explicit "start": 0 aligns fixed windows with the epoch.
func (l *Limit) UnmarshalJSON(b []byte) error {
	var j limitJSON
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&j); err != nil {
		return fmt.Errorf("limit: %w", err)
	}
	// In Go a zero Period or Burst means the default; in JSON the default
	// is an absent field, and an explicit zero is an invalid limit.
	*l = Limit{Algorithm: j.Algorithm, Rate: j.Rate, Refill: j.Refill, MaxReserved: j.MaxReserved, MaxInFlight: j.MaxInFlight}
	if j.Slots != nil {
		if *j.Slots == 0 {
			return fmt.Errorf("%w: slots must be from 1 to %d", ErrInvalidLimit, bucket.MaxSlots)
		}
		l.Slots = *j.Slots
	}
	if j.LeaseTTL != nil {
		if *j.LeaseTTL <= 0 {
			return fmt.Errorf("%w: lease_ttl must be > 0", ErrInvalidLimit)
		}
		l.LeaseTTL = time.Duration(*j.LeaseTTL)
	}
	if j.Period != nil {
		if j.Period.calendar != "" {
			l.Calendar = j.Period.calendar
		} else if j.Period.d <= 0 {
			return fmt.Errorf("%w: period must be > 0", ErrInvalidLimit)
		} else {
			l.Period = time.Duration(j.Period.d)
		}
	}
	if j.TimeZone != "" {
		loc, err := loadZone(j.TimeZone)
		if err != nil {
			return err
		}
		l.Location = loc
	}
	if j.Burst != nil {
		if !(*j.Burst > 0) {
			return fmt.Errorf("%w: burst must be > 0", ErrInvalidLimit)
		}
		l.Burst = *j.Burst
	}
	if j.Start != nil {
		l.Start = time.Duration(*j.Start)
		if l.Start == 0 {
			l.Start = l.period()
		}
	}
	return nil
}

// periodJSON is a limit's period in JSON: a duration, or a calendar
// period ("day", "week", "month").
type periodJSON struct {
	d        seconds.Duration
	calendar string
}

func (p periodJSON) MarshalJSON() ([]byte, error) {
	if p.calendar != "" {
		return json.Marshal(p.calendar)
	}
	return p.d.MarshalJSON()
}

func (p *periodJSON) UnmarshalJSON(b []byte) error {
	var s string
	if json.Unmarshal(b, &s) == nil && (s == "day" || s == "week" || s == "month") {
		p.calendar = s
		return nil
	}
	return p.d.UnmarshalJSON(b)
}

// loadZone loads a time zone of the time zone database by name
// (calendar.LoadZone).
func loadZone(name string) (*time.Location, error) {
	loc, err := calendar.LoadZone(name)
	if err != nil {
		return nil, fmt.Errorf("%w: time_zone: %w", ErrInvalidLimit, err)
	}
	return loc, nil
}

type decisionJSON struct {
	Allowed    bool    `json:"allowed"`
	Tokens     float64 `json:"tokens"`
	Remaining  int64   `json:"remaining"`
	Limit      float64 `json:"limit"`
	RetryAfter float64 `json:"retry_after"`
	ResetAfter float64 `json:"reset_after"`
}

// MarshalJSON encodes d as docs/api.md shows it, with times in seconds.
func (d Decision) MarshalJSON() ([]byte, error) {
	return json.Marshal(decisionJSON{d.Allowed, d.Tokens, d.Remaining, d.Burst, d.RetryAfter.Seconds(), d.ResetAfter.Seconds()})
}

// UnmarshalJSON decodes the shape MarshalJSON writes.
func (d *Decision) UnmarshalJSON(b []byte) error {
	var j decisionJSON
	if err := json.Unmarshal(b, &j); err != nil {
		return err
	}
	*d = Decision{j.Allowed, j.Tokens, j.Remaining, j.Limit, time.Duration(math.Round(j.RetryAfter * 1e9)), time.Duration(math.Round(j.ResetAfter * 1e9))}
	return nil
}

type multiJSON struct {
	Allowed    bool       `json:"allowed"`
	RetryAfter float64    `json:"retry_after"`
	Results    []Decision `json:"results"`
}

// MarshalJSON encodes m as {"allowed", "retry_after", "results"}.
func (m Multi) MarshalJSON() ([]byte, error) {
	return json.Marshal(multiJSON{m.Allowed, m.RetryAfter.Seconds(), m.Decisions})
}

// UnmarshalJSON decodes the shape MarshalJSON writes.
func (m *Multi) UnmarshalJSON(b []byte) error {
	var j multiJSON
	if err := json.Unmarshal(b, &j); err != nil {
		return err
	}
	*m = Multi{j.Allowed, time.Duration(math.Round(j.RetryAfter * 1e9)), j.Results}
	return nil
}
