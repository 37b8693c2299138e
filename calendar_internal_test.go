package drip

import (
	"context"
	"testing"
	"time"

	"github.com/driplimit/drip/bucket"
	"github.com/driplimit/drip/store/memstore"
)

// TestCalendarHintsPastTheEnd: a store deciding on its own clock, 10 s
// into February while the caller's clock still reads January, counts in
// February and waits until March 1st at Berlin's midnight, not 31 days
// on (drip.Apply and a Limiter both); a Limiter whose clock both share
// waits for the window it was handed.
func TestCalendarHintsPastTheEnd(t *testing.T) {
	berlin, err := time.LoadLocation("Europe/Berlin")
	if err != nil {
		t.Fatal(err)
	}
	caller := time.Date(2026, 1, 31, 23, 59, 59, 0, berlin)
	storeNow := time.Date(2026, 2, 1, 0, 0, 10, 0, berlin)
	march := time.Date(2026, 3, 1, 0, 0, 0, 0, berlin)
	old := wallNow
	wallNow = func() time.Time { return caller }
	t.Cleanup(func() { wallNow = old })

	l := Limit{Algorithm: FixedWindow, Rate: 2, Calendar: "month", Location: berlin}
	ms := memstore.New(memstore.WithClock(func() time.Time { return storeNow }))
	t.Cleanup(func() { ms.Close() })
	ctx := context.Background()
	want := march.Sub(storeNow)

	m, err := Apply(ctx, ms, bucket.Take, time.Time{}, Request{Key: "a", Limit: l, Cost: 2})
	if err != nil {
		t.Fatal(err)
	}
	if d := m.Decisions[0]; !d.Allowed || d.ResetAfter != want {
		t.Errorf("take of 2: %+v, want allowed, reset in %v", d, want)
	}
	m, err = Apply(ctx, ms, bucket.Take, time.Time{}, Request{Key: "a", Limit: l, Cost: 1})
	if err != nil {
		t.Fatal(err)
	}
	if d := m.Decisions[0]; d.Allowed || d.RetryAfter != want || d.ResetAfter != want {
		t.Errorf("take past the count: %+v, want denied, retry and reset in %v", d, want)
	}

	lim := New(ms, l)
	if d, err := lim.TakeN(ctx, "b", 2); err != nil || !d.Allowed || d.ResetAfter != want {
		t.Errorf("Limiter: %+v, %v, want allowed, reset in %v", d, err, want)
	}
	// One clock for both: January's end.
	lim = New(ms, l, WithClock(func() time.Time { return caller }))
	if d, err := lim.TakeN(ctx, "c", 2); err != nil || !d.Allowed || d.ResetAfter != time.Second {
		t.Errorf("Limiter on the caller's clock: %+v, %v, want a reset in 1s", d, err)
	}
}
