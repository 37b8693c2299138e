// Package seconds reads and writes durations as drip's JSON and HTTP
// headers count them: in JSON a Go duration string ("1.5s") or a number
// of seconds, in headers whole seconds rounded up.
package seconds

import (
	"encoding/json"
	"fmt"
	"math"
	"strconv"
	"time"
)

// Duration is a duration that reads from JSON as a Go duration string
// ("1.5s", "2m") or a number of seconds (1.5, "1.5"), and writes as a Go
// duration string.
type Duration time.Duration

// MarshalJSON writes s as a Go duration string.
func (s Duration) MarshalJSON() ([]byte, error) {
	return json.Marshal(time.Duration(s).String())
}

// UnmarshalJSON reads a duration string or a number of seconds.
func (s *Duration) UnmarshalJSON(b []byte) error {
	var v any
	if err := json.Unmarshal(b, &v); err != nil {
		return err
	}
	d, err := Parse(v)
	if err != nil {
		return err
	}
	*s = Duration(d)
	return nil
}

// Parse reads a JSON value as a duration: a number of seconds, a
// numeric string of seconds, or a Go duration string.
func Parse(v any) (time.Duration, error) {
	switch x := v.(type) {
	case float64:
		return fromFloat(x)
	case json.Number:
		f, err := x.Float64()
		if err != nil {
			return 0, err
		}
		return fromFloat(f)
	case string:
		if f, err := strconv.ParseFloat(x, 64); err == nil {
			return fromFloat(f)
		}
		d, err := time.ParseDuration(x)
		if err != nil {
			return 0, fmt.Errorf("%q is not a duration (\"10s\") or a number of seconds", x)
		}
		return d, nil
	}
	return 0, fmt.Errorf("%v is not a duration (\"10s\") or a number of seconds", v)
}

func fromFloat(f float64) (time.Duration, error) {
	if math.IsNaN(f) || math.IsInf(f, 0) || math.Abs(f) > 9e9 {
		return 0, fmt.Errorf("%v is not a usable number of seconds", f)
	}
	return time.Duration(math.Round(f * 1e9)), nil
}

// Ceil is d in whole seconds, rounded up (0 for d <= 0), as HTTP
// headers count time.
func Ceil(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	s := int64(d / time.Second)
	if d%time.Second != 0 {
		s++
	}
	return s
}
