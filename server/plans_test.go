package server

import (
	"context"
	"fmt"
	"testing"

	"github.com/driplimit/drip/replay"
	"github.com/driplimit/drip/store/memstore"
)

// TestInlineLimitsAllocate holds a decision API take of an inline limit
// to the allocations of a take of one limit, however many limits the API
// meets (drip.Apply's process-wide cache holds 8, and allocates for each
// it holds), and for a fixed window without start (placed by its key) or
// a calendar window (placed by the time): the engine compiles an inline
// limit once for the request, and places its window from the plan.
func TestInlineLimitsAllocate(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts under the race detector, whose sync.Pool drops items")
	}
	s, err := New(Config{AdminListen: "off"}, memstore.New(memstore.WithSweep(0)))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	allocs := func(limits ...string) float64 {
		bs := make([]replay.Raw, len(limits))
		for i, l := range limits {
			b, err := replay.Decode(fmt.Appendf(nil, `{"key": "k%d", "limit": %s}`, i, l), replay.BodyFormat)
			if err != nil {
				t.Fatal(err)
			}
			bs[i] = b
		}
		i := 0
		return testing.AllocsPerRun(200, func() {
			if _, err := s.decide(ctx, "take", bs[i%len(bs)]); err != nil {
				t.Fatal(err)
			}
			i++
		})
	}
	base := allocs(`{"rate": 1000000000}`)
	var many []string
	for i := range 16 {
		many = append(many, fmt.Sprintf(`{"rate": %d}`, 1000000000+i))
	}
	if got := allocs(many...); got > base {
		t.Errorf("takes of 16 limits in turn: %v allocations a take, of one limit %v", got, base)
	}
	for _, l := range []string{
		`{"algorithm": "fixed_window", "rate": 1000000000, "period": "1m"}`,
		`{"algorithm": "fixed_window", "rate": 1000000000, "period": "day", "time_zone": "Europe/Paris"}`,
	} {
		if got := allocs(l); got > base {
			t.Errorf("%s: %v allocations a take, a token bucket's %v", l, got, base)
		}
	}
	t.Logf("a token bucket's take: %v allocations", base)
}
