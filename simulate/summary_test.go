package simulate

import "testing"

// TestRateUnits: a long run's accepted rate is shown in a unit that does
// not round it to nothing (a calendar limit's 100 a day is not "0.0/s").
func TestRateUnits(t *testing.T) {
	for _, c := range []struct {
		perSecond float64
		want      string
	}{
		{0, "0.0/s"},
		{10, "10.0/s"},
		{0.1, "0.1/s"},
		{0.05, "180.0/h"},
		{4.5 / 3600, "4.5/h"},
		{100.0 / 86400, "4.2/h"},
		{2.0 / 86400, "2.0/day"},
	} {
		if got := rate(c.perSecond); got != c.want {
			t.Errorf("rate(%g) = %q, want %q", c.perSecond, got, c.want)
		}
	}
}
