package bucket

import (
	"testing"
	"time"
)

// TestCalendarRules: a calendar window's two rules beside a fixed
// window's, with windows of 31 and 28 units (a month after February).
func TestCalendarRules(t *testing.T) {
	const u = int64(time.Hour)
	// March: [100u, 131u), after February [72u, 100u).
	march := Params{Kind: Calendar, Rate: 2 * Micro, Burst: 2 * Micro, Period: 31 * u, Start: 100 * u}
	feb := State{Tokens: 0, TS: 72 * u} // February's window, emptied
	for _, tc := range []struct {
		name  string
		b     State
		found bool
		now   int64
		want  Result
		ts    int64
	}{
		// On a fixed window's grid of 31u from 72u, February's state
		// would not refill before 103u: a calendar window starts afresh.
		{"a state from an earlier window is stale", feb, true, 101 * u,
			Result{Allowed: true, Tokens: Micro, ResetAfter: time.Duration(30 * u)}, 100 * u},
		// The store's clock is behind the caller's, which found March
		// begun: the decision is made at March's start.
		{"a time before the window is its start", feb, true, 99 * u,
			Result{Allowed: true, Tokens: Micro, ResetAfter: time.Duration(31 * u)}, 100 * u},
		// The store's clock is past March's end: the next window starts
		// at the end, on the grid of the params it was handed.
		{"a time past the window is in the next", State{Tokens: 0, TS: 100 * u}, true, 132 * u,
			Result{Allowed: true, Tokens: Micro, ResetAfter: time.Duration(30 * u)}, 131 * u},
		{"the window's own state counts", State{Tokens: Micro, TS: 100 * u}, true, 120 * u,
			Result{Allowed: true, Tokens: 0, ResetAfter: time.Duration(11 * u)}, 100 * u},
		{"a denial waits for the end", State{Tokens: 0, TS: 100 * u}, true, 120 * u,
			Result{Allowed: false, Tokens: 0, RetryAfter: time.Duration(11 * u), ResetAfter: time.Duration(11 * u)}, 100 * u},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, n, _ := Eval(Take, tc.b, tc.found, march, Micro, false, tc.now)
			if r != tc.want || n.TS != tc.ts {
				t.Errorf("got %+v ts %du, want %+v ts %du", r, n.TS/u, tc.want, tc.ts/u)
			}
		})
	}
}
