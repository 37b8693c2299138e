package simulate

import (
	"time"

	"github.com/driplimit/drip"
)

func (r *Row) count(allowed bool) {
	r.Sent++
	if allowed {
		r.Accepted++
	} else {
		r.Denied++
	}
}

// spans cuts [0, end) into spans of step; the last may reach past end.
func spans(end, step time.Duration) []Row {
	n := int((end + step - 1) / step)
	rows := make([]Row, max(1, n))
	for i := range rows {
		rows[i] = Row{From: time.Duration(i) * step, To: time.Duration(i+1) * step}
	}
	return rows
}

func index(at, step time.Duration, n int) int {
	return min(int(at/step), n-1)
}

func periodOf(l drip.Limit) time.Duration {
	if l.Period <= 0 {
		return time.Second
	}
	return l.Period
}
