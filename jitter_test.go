package drip_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/driplimit/drip"
)

// TestRetryJitterCap: the jitter of a long wait is capped in absolute
// terms (a one-day wait gets at most 60 s more, not 12 hours), still
// spreads clients and stays fixed per identity; short waits keep their
// full 50%.
func TestRetryJitterCap(t *testing.T) {
	day := 24 * time.Hour
	j := drip.DefaultRetryJitter
	values := map[int64]int{}
	for i := range 500 {
		id := fmt.Sprint("client-", i)
		v := j.Seconds(id, day)
		if v < 86400 || v > 86400+60 {
			t.Fatalf("%s: Retry-After %d for a one-day wait, want within [86400, 86460]", id, v)
		}
		if j.Seconds(id, day) != v {
			t.Fatalf("%s: two answers for one identity", id)
		}
		values[v]++
	}
	if len(values) < 50 {
		t.Errorf("500 clients spread over only %d values", len(values))
	}
	// Up to two minutes, the cap does not bind: the same as an uncapped 50%.
	for _, d := range []time.Duration{time.Second, 10 * time.Second, 119 * time.Second, 120 * time.Second} {
		for i := range 100 {
			id := fmt.Sprint("c", i)
			if got, want := j.Seconds(id, d), drip.RetryAfterSeconds(id, d, 0.5); got != want {
				t.Fatalf("%v %s: %d, uncapped %d", d, id, got, want)
			}
		}
	}
	// Another cap, rounded up to whole seconds; a zero cap or fraction is
	// no jitter.
	for _, c := range []struct {
		j   drip.RetryJitter
		max int64
	}{
		{drip.RetryJitter{Fraction: 0.5, Max: 1500 * time.Millisecond}, 2},
		{drip.RetryJitter{Fraction: 1, Max: 10 * time.Second}, 10},
		{drip.RetryJitter{Fraction: 0.5}, 0},
		{drip.RetryJitter{Max: time.Hour}, 0},
	} {
		hi := int64(0)
		for i := range 300 {
			hi = max(hi, c.j.Seconds(fmt.Sprint("c", i), day)-86400)
		}
		if hi != c.max {
			t.Errorf("%+v: the largest jitter over 300 clients is %d s, want %d", c.j, hi, c.max)
		}
	}
}
